"""TaskD's API as TaskD's users call it: one DLRecoverManager per process, module functions that find it.

Written against TaskD's import path and its positional signature (info, server_addr, secure_conn,
cert_path), with a scriptable real gRPC server on loopback (tests/e2e/client/test_client.py's TinyServer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from support import wait_until
from support.client import JOB, WAIT, TinyServer, fresh_instance  # noqa: F401 (an autouse fixture)

from taskd.proto import recover_pb2 as pb
from taskd.python.toolkit.recover_module import recover_manager as rm
from taskd.vocabulary import Code


@pytest.fixture
def server():
    srv = TinyServer().start()
    yield srv
    srv.stop()


def info(node_rank: int = 0) -> pb.ClientInfo:
    return pb.ClientInfo(jobId=JOB, role="master agent", nodeRank=node_rank)


def subscribe(mgr: rm.DLRecoverManager) -> threading.Thread:
    thread = threading.Thread(target=mgr.start_subscribe, args=("pytorch",), daemon=True)
    thread.start()
    wait_until(lambda: mgr.connected, what="subscribed")
    return thread


def test_one_instance_and_module_functions_find_it_without_set_manager(server) -> None:
    mgr = rm.DLRecoverManager(info(), server.address, False, "")
    assert rm.DLRecoverManager(info(), server.address, False, "") is mgr
    assert rm.get_recover_manager_instance() is mgr
    assert rm.report_process_fault({1: 1}) == 0
    assert rm.report_stop_complete(0, "stopped", {1: 1}) == 0
    assert rm.report_recover_strategy({1: 1}, ["recover", "exit"]) == 0
    assert rm.report_recover_status(0, "ok", {1: 1}, "recover") == 0
    fault = server.recorder.requests("ReportProcessFault")[0]
    assert fault.jobId == JOB and [(f.rankId, f.faultType) for f in fault.faultRanks] == [("1", "1")]


def test_same_arguments_keep_a_live_instance_untouched(server) -> None:
    mgr = rm.DLRecoverManager(info(), server.address)
    got: list[str] = []
    mgr.register_action_handler("stop_train", lambda sig: got.append(sig.uuid))
    assert mgr.init_clusterd() and mgr.register(mgr.client_info).code == 0
    thread = subscribe(mgr)
    try:
        assert rm.DLRecoverManager(info(), server.address) is mgr  # e.g. init_grpc_recover_manager() again
        server.recorder.push(uuid="s1", signalType="stopTrain", actions=["stop_train"])
        wait_until(lambda: got == ["s1"], what="the handler registered before the second construction")
        assert server.recorder.subscriptions == 1
    finally:
        mgr.stop()
        thread.join(WAIT)


def test_other_arguments_reconfigure_the_same_object_as_taskd_does(server) -> None:
    mgr = rm.DLRecoverManager(info(node_rank=0), server.address)
    again = rm.DLRecoverManager(info(node_rank=5), server.address)
    assert again is mgr and mgr.info.nodeRank == 5
    assert rm.report_process_fault({1: 1}) == 0
    assert server.recorder.requests("ReportProcessFault")[0].nodeRank == 5


def test_other_arguments_while_subscribed_are_refused_clearly(server) -> None:
    mgr = rm.DLRecoverManager(info(node_rank=0), server.address)
    thread = subscribe(mgr)
    try:
        with pytest.raises(RuntimeError, match="RecoverClient"):
            rm.DLRecoverManager(info(node_rank=1), server.address)
        assert mgr.info.nodeRank == 0 and mgr.connected  # unchanged
    finally:
        mgr.stop()
        thread.join(WAIT)
    # once stopped, a construction starts it afresh, like a new object
    again = rm.DLRecoverManager(info(node_rank=1), server.address)
    assert again is mgr and mgr.info.nodeRank == 1
    thread = subscribe(mgr)
    mgr.stop()
    thread.join(WAIT)
    assert not thread.is_alive()


def test_a_refused_first_construction_leaves_no_instance(server) -> None:
    with pytest.raises(rm.ConfigurationError, match="jobId"):
        rm.DLRecoverManager(pb.ClientInfo(), server.address)
    assert rm.DLRecoverManager.instance is None


def test_without_an_instance_the_functions_build_it_from_the_environment(server, monkeypatch) -> None:
    monkeypatch.setenv("MINDX_TASK_ID", JOB)
    monkeypatch.setenv("MINDX_SERVER_IP", server.address)
    assert rm.report_process_fault({2: 0}) == 0
    built = rm.DLRecoverManager.instance
    assert built is not None and rm.get_recover_manager_instance() is built
    assert built.client_info.role == "master agent"


def test_set_manager_takes_precedence_for_an_agent_client(server) -> None:
    singleton = rm.DLRecoverManager(info(node_rank=0), server.address)
    agent = rm.RecoverClient(info(node_rank=7), server.address)
    try:
        assert agent is not singleton
        rm.set_manager(agent)
        assert rm.report_process_fault({1: 1}) == 0
        assert server.recorder.requests("ReportProcessFault")[0].nodeRank == 7
    finally:
        agent.stop()


def test_reset_instance_gives_a_new_object(server) -> None:
    first = rm.DLRecoverManager(info(), server.address)
    rm.DLRecoverManager.reset_instance()
    assert rm.DLRecoverManager(info(), server.address) is not first


# -- issue 18 item 2: TaskD's public API exactly (each from TaskD's source or its own unit tests) ------------


def test_a_taskd_style_servicer_from_the_pb_path_answers_the_module_functions(monkeypatch) -> None:
    """TaskD's test_recover_module.py: a servicer written against `pb.recover_pb2_grpc` on a real server."""
    from concurrent import futures

    import grpc

    from taskd.python.toolkit.recover_module.pb import recover_pb2 as tpb
    from taskd.python.toolkit.recover_module.pb import recover_pb2_grpc

    class Servicer(recover_pb2_grpc.RecoverServicer):
        def __init__(self) -> None:
            self.faults: list[tpb.ProcessFaultRequest] = []

        def ReportProcessFault(self, request, context):
            self.faults.append(request)
            return tpb.Status(code=0, info="ok")

    servicer = Servicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    recover_pb2_grpc.add_RecoverServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("MINDX_TASK_ID", JOB)
        monkeypatch.setenv("MINDX_SERVER_IP", f"127.0.0.1:{port}")
        assert rm.report_process_fault({1: 0, 2: 0}) == 0
        assert [(f.rankId, f.faultType) for f in servicer.faults[0].faultRanks] == [("1", "0"), ("2", "0")]
    finally:
        server.stop(0)


def test_report_process_fault_takes_taskd_fault_codes_argument(server) -> None:
    """TaskD: `report_process_fault(fault_ranks: dict, fault_codes: dict = None)` (MindIO passes both)."""
    rm.DLRecoverManager(info(), server.address)
    assert rm.report_process_fault({1: 1}) == 0
    assert rm.report_process_fault({2: 1}, None) == 0
    assert rm.report_process_fault({3: 1}, {3: "0x80CB0001"}) == 0
    assert rm.report_process_fault({4: 1}, fault_codes={}) == 0
    requests = server.recorder.requests("ReportProcessFault")
    assert [r.faultRanks[0].rankId for r in requests] == ["1", "2", "3", "4"]
    assert requests[2].detail == "fault codes rank 3: 0x80CB0001"  # kept, where TaskD drops them
    assert requests[0].detail == requests[1].detail == requests[3].detail == ""
    assert rm.report_process_fault({5: 1}, ["0x1"]) == Code.INVALID_PARAMS
    assert len(server.recorder.requests("ReportProcessFault")) == 4  # a bad fault_codes sends nothing


def test_instance_is_taskd_class_attribute_and_its_reset_idiom_works(server, monkeypatch) -> None:
    """TaskD's tests construct, then `DLRecoverManager.instance = None`; the module functions must then
    build a new instance from the environment (TaskD's get_instance -> init_grpc_recover_manager)."""
    first = rm.DLRecoverManager(info(), server.address)
    assert rm.DLRecoverManager.instance is first  # an attribute, not a method
    rm.DLRecoverManager.instance = None
    assert first.report_process_fault({0: 1}) == 0  # the object itself still works
    monkeypatch.setenv("MINDX_TASK_ID", JOB)
    monkeypatch.setenv("MINDX_SERVER_IP", server.address)
    assert rm.report_process_fault({1: 1}) == 0  # no "NoneType is not callable"
    assert rm.report_stop_complete(0, "stopped", {1: 1}) == 0
    rebuilt = rm.DLRecoverManager.instance
    assert rebuilt is not None and rebuilt is not first and rm.get_recover_manager_instance() is rebuilt
    assert rm.DLRecoverManager(info(), server.address) is rebuilt
    first.stop()


def test_importing_the_client_turns_grpc_fork_support_off_before_grpc_loads() -> None:
    """msrun forks its ranks with a preexec_fn: gRPC's fork handlers must be off (docs/mindspore.md)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for module in ("taskd.client", "taskd.python.toolkit.recover_module.recover_manager",
                   "taskd.python.framework.agent.ms_mgr.msrun_plugin"):
        code = (f"import os, {module}, grpc; from grpc._cython import cygrpc; "
                "print(cygrpc.is_fork_support_enabled(), os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        # off in gRPC, and not left in the environment the ranks inherit (issue 18: it leaked into every rank)
        assert out.stdout.strip() == "False None", (module, out.stdout, out.stderr)
    code = "import os, taskd.client; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    env["GRPC_ENABLE_FORK_SUPPORT"] = "true"  # the user's own value is theirs: kept
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "true", (out.stdout, out.stderr)
