"""Every bad input gets its status code and an info naming the problem; the server keeps serving."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.scripted_agent import CALL_TIMEOUT, ScriptedAgent, StreamEnded, fault_ranks

from taskd.controller.config import ConfigError
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code

R = recover_pb2
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[str, ScriptedAgent]]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.5)
    with EmbeddedController(cfg) as ctl:
        agent = ScriptedAgent(ctl.address, "vjob", node_rank=0, node_count=2)
        agent.join()  # node 1 of the 2-node job never registers
        yield ctl.address, agent
        agent.close()


@pytest.fixture(scope="module")
def stubs(env) -> Iterator[tuple[recover_pb2_grpc.RecoverStub, taskd_pb2_grpc.AgentReportStub,
                                 taskd_pb2_grpc.JobStatusStub]]:
    with grpc.insecure_channel(env[0]) as ch:
        yield recover_pb2_grpc.RecoverStub(ch), taskd_pb2_grpc.AgentReportStub(ch), taskd_pb2_grpc.JobStatusStub(ch)


LONG = "x" * 4097
FR = fault_ranks

CASES = {
    # name: (method, request, code, words in info)
    "empty jobId": ("ReportProcessFault", R.ProcessFaultRequest(jobId="", faultRanks=FR({1: 1})), 409, "jobId"),
    "over-long jobId": ("Init", R.ClientInfo(jobId=LONG), 409, "jobId"),
    "non-numeric rankId": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="abc", faultType="1")]), 409, "faultRanks[0].rankId"),
    "negative rankId": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="1"), R.FaultRank(rankId="-2", faultType="1")]),
        409, "faultRanks[1].rankId"),
    "fault type not 0/1/2": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="7")]), 409, "faultType"),
    "no fault ranks": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob"), 409, "faultRanks is empty"),
    "too many fault ranks": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="1")] * 100_001), 409, "100001 entries"),
    "over-long detail": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob", faultRanks=FR({1: 1}),
                                                                     detail=LONG), 409, "detail"),
    "unknown strategy": ("ReportRecoverStrategy", R.RecoverStrategyRequest(jobId="vjob", strategies=["reboot"]),
                         409, "strategies[0] 'reboot'"),
    "unknown strategy in status": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="reboot"),
                                   409, "strategy 'reboot'"),
    "bad isolate rank": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="recover",
                                                                       isolateRankIds=["x"]), 409, "isolateRankIds"),
    "over-long status info": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob", status=R.Status(info=LONG)),
                              409, "status.info"),
    "negative nodeRank": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob", nodeRank=-1), 409, "nodeRank"),
    "unknown policy strategy": ("Init", R.ClientInfo(jobId="vjob", strategies=["fix-it"]), 409, "strategies[0]"),
    "negative maxRestarts": ("Init", R.ClientInfo(jobId="vjob", maxRestarts=-1), 409, "maxRestarts"),
    "register out of range": ("Register", R.ClientInfo(jobId="vjob", nodeRank=2), 409, "nodeRank 2 out of range"),
    "unknown job": ("ReportProcessFault", R.ProcessFaultRequest(jobId="nojob", faultRanks=FR({1: 1})), 402,
                    "job nojob does not exist"),
    "register unknown job": ("Register", R.ClientInfo(jobId="nojob"), 402, "does not exist"),
    "unregistered node": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob", nodeRank=1, faultRanks=FR({1: 1})),
                          400, "node 1 of job vjob is not registered"),
    "health of unregistered node": ("HealthCheck", R.ClientInfo(jobId="vjob", nodeRank=1), 400, "not registered"),
    "health of unknown job": ("HealthCheck", R.ClientInfo(jobId="nojob"), 400, "does not exist"),
    "out of order": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob"), 401,
                     "job vjob is RUNNING, not STOPPING"),
    "status out of order": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="recover"), 401,
                            "RUNNING"),
}


@pytest.mark.parametrize("method,request_,code,words", CASES.values(), ids=CASES.keys())
def test_bad_input_is_answered_with_its_code(env, stubs, method: str, request_, code: int, words: str) -> None:
    recover, _, _ = stubs
    status = getattr(recover, method)(request_, timeout=CALL_TIMEOUT)
    assert status.code == code and words in status.info, status
    assert env[1].health().code == 0  # still serving, the job untouched
    assert env[1].list_jobs("vjob").jobs[0].state == "RUNNING"


def test_agent_report_and_status_service_inputs(stubs) -> None:
    _, reports, status = stubs
    bad = reports.ReportFinished(taskd_pb2.FinishRequest(jobId=""), timeout=CALL_TIMEOUT)
    assert bad.code == Code.INVALID_PARAMS and "jobId" in bad.info
    unknown = reports.ReportFinished(taskd_pb2.FinishRequest(jobId="nojob"), timeout=CALL_TIMEOUT)
    assert unknown.code == Code.JOB_NOT_EXIST
    unregistered = reports.ReportFinished(taskd_pb2.FinishRequest(jobId="vjob", nodeRank=1), timeout=CALL_TIMEOUT)
    assert unregistered.code == Code.NOT_REGISTERED
    missing = status.ListJobs(taskd_pb2.JobQuery(jobId="nojob"), timeout=CALL_TIMEOUT)
    assert missing.status.code == Code.JOB_NOT_EXIST and not missing.jobs
    before = status.ListJobs(taskd_pb2.JobQuery(jobId="vjob"), timeout=CALL_TIMEOUT).jobs[0].events
    for req, code, words in [  # training resumed (ReportResumed): refused, and nothing recorded
        (taskd_pb2.ResumedRequest(jobId="", round=1), Code.INVALID_PARAMS, "jobId is empty"),
        (taskd_pb2.ResumedRequest(jobId="vjob", round=1, seconds=-1.0), Code.INVALID_PARAMS, "seconds must be"),
        (taskd_pb2.ResumedRequest(jobId="vjob", round=0), Code.INVALID_PARAMS, "round must be >= 1"),
        (taskd_pb2.ResumedRequest(jobId="nojob", round=1), Code.JOB_NOT_EXIST, "does not exist"),
        (taskd_pb2.ResumedRequest(jobId="vjob", nodeRank=1, round=1), Code.NOT_REGISTERED, "not registered"),
        (taskd_pb2.ResumedRequest(jobId="vjob", round=3), Code.OUT_OF_ORDER, "no round recovered yet"),
    ]:
        answer = reports.ReportResumed(req, timeout=CALL_TIMEOUT)
        assert answer.code == code and words in answer.info, (req, answer)
    assert status.ListJobs(taskd_pb2.JobQuery(jobId="vjob"), timeout=CALL_TIMEOUT).jobs[0].events == before


@pytest.mark.parametrize("info,grpc_code,code", [
    (R.ClientInfo(jobId="nojob"), grpc.StatusCode.NOT_FOUND, "402"),
    (R.ClientInfo(jobId="vjob", nodeRank=1), grpc.StatusCode.FAILED_PRECONDITION, "400"),
    (R.ClientInfo(jobId=""), grpc.StatusCode.INVALID_ARGUMENT, "409"),
], ids=["unknown job", "unregistered", "empty job id"])
def test_bad_subscription_ends_with_the_code(stubs, env, info, grpc_code, code: str) -> None:
    recover, _, _ = stubs
    call = recover.SubscribeProcessManageSignal(info, timeout=CALL_TIMEOUT)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(call))
    assert err.value.code() == grpc_code and err.value.details().startswith(code)
    assert env[1].health().code == 0


# ---------------------------------------------------------------------------- ControllerConfig checks itself


def test_embedded_controller_is_refused_exactly_as_taskd_server(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", stop_timeout=0,
                                            agent_loss_timeout=-1))
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state",
                           str(tmp_path / "s.sqlite3"), "--stop-timeout", "0", "--agent-loss-timeout", "-1"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    for problem in err.value.problems:  # the same lines, word for word (the CLI's floats print as 0.0)
        assert problem.replace("got 0 ", "got 0.0 ").replace("got -1 ", "got -1.0 ") in proc.stderr, proc.stderr
    assert not (tmp_path / "s.sqlite3").exists()


# ---------------------------------------------------------------------------- bounds, checked before any change

BOUNDS = {
    "NUL in jobId": ("Init", R.ClientInfo(jobId="a\x00b"), 409, "unprintable character U+0000"),
    "right-to-left override in jobId": ("Init", R.ClientInfo(jobId="job\u202eexe"), 409, "U+202E"),
    "zero-width space in jobId": ("Init", R.ClientInfo(jobId="job\u200b"), 409, "U+200B"),
    "257-byte jobId": ("Init", R.ClientInfo(jobId="é" * 129), 409, "258 bytes long (max 256)"),
    "rank 2^63": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId=str(2**63), faultType="1")]), 409, "32-bit"),
    "rank of 5000 digits": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="9" * 5000, faultType="1")]), 409, "32-bit"),
    "nodeCount 2^31-1": ("Init", R.ClientInfo(jobId="huge", nodeCount=2**31 - 1), 409, "--max-node-count"),
    "world beyond int32": ("Init", R.ClientInfo(jobId="huge", nodeCount=65536, ranksPerNode=65536), 409,
                           "does not fit 32-bit"),
    "rank 999 of a 2-rank job": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob", faultRanks=FR({999: 1})),
                                 402, "rank 999 is not in the job: it has ranks 0-1"),
    "node 0 reports node 1's rank": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", nodeRank=0, faultRanks=FR({1: 1})), 402, "not one of node 0's ranks (0-0)"),
    "fault list longer than the job": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=FR({0: 1}) * 3), 409, "3 entries, more than the job's 2 ranks"),
    "isolated rank outside the job": ("ReportRecoverStatus", R.RecoverStatusRequest(
        jobId="vjob", strategy="recover", isolateRankIds=["7"]), 402, "rank 7 is not in the job"),
    "stop-complete rank outside the job": ("ReportStopComplete", R.StopCompleteRequest(
        jobId="vjob", faultRanks=FR({5: 1})), 402, "rank 5 is not in the job"),
}


def state_dump(path: Path) -> list[str]:
    """Every row of the state file, read through a connection of its own (what a restart would load)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.iterdump())


@pytest.fixture(scope="module")
def disk_env(tmp_path_factory) -> Iterator[tuple[str, Path, ScriptedAgent]]:
    path = tmp_path_factory.mktemp("state") / "ctl.sqlite3"
    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.5)
                            ) as ctl:
        agent = ScriptedAgent(ctl.address, "vjob", node_rank=0, node_count=2, ranks_per_node=1).join()
        yield ctl.address, path, agent
        agent.close()


@pytest.mark.parametrize("method,request_,code,words", BOUNDS.values(), ids=BOUNDS.keys())
def test_out_of_bounds_input_is_refused_and_changes_neither_memory_nor_disk(disk_env, method, request_, code,
                                                                             words) -> None:
    address, path, agent = disk_env
    before_mem, before_disk = agent.list_jobs(), state_dump(path)
    with grpc.insecure_channel(address) as ch:
        status = getattr(recover_pb2_grpc.RecoverStub(ch), method)(request_, timeout=CALL_TIMEOUT)
    assert status.code == code and words in status.info, status
    assert agent.list_jobs() == before_mem and state_dump(path) == before_disk
    job = before_mem.jobs[0]
    assert job.state == "RUNNING" and job.restarts == 0 and not job.rounds  # no round opened, nothing spent


def test_undecodable_bytes_get_invalid_argument_and_one_log_line(env, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="taskd.controller.service.guard")
    with grpc.insecure_channel(env[0]) as ch:
        for method in ("/Recover/ReportProcessFault", "/Recover/Init", "/taskd.v1.JobStatus/ListJobs"):
            call = ch.unary_unary(method)  # raw bytes: no serializer
            with pytest.raises(grpc.RpcError) as err:
                call(b"\xff\xff\xff\xff\x0f", timeout=CALL_TIMEOUT)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert err.value.details().startswith("409: the request to " + method)
        stream = ch.unary_stream("/Recover/SubscribeProcessManageSignal")(b"\x0a\x05\xff\xfe\xfd\xfc\xfb")
        with pytest.raises(grpc.RpcError) as err:
            next(iter(stream))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = [r for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None  # rate-limited, and no traceback
    assert env[1].health().code == 0


def test_a_request_over_4_mb_is_refused(env) -> None:
    with grpc.insecure_channel(env[0], options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        req = R.ProcessFaultRequest(jobId="vjob", detail="x" * (5 << 20))
        with pytest.raises(grpc.RpcError) as err:
            recover_pb2_grpc.RecoverStub(ch).ReportProcessFault(req, timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert env[1].list_jobs("vjob").jobs[0].state == "RUNNING"


def test_a_live_agent_is_not_replaced_by_another_host_or_pid(disk_env) -> None:
    address, path, agent = disk_env
    impostor = ScriptedAgent(address, "vjob", node_rank=0, node_count=2, ranks_per_node=1, host="elsewhere",
                             pid=4242)
    try:
        before = state_dump(path)
        status = impostor.register()
        assert status.code == Code.INVALID_PARAMS and "held by a live agent" in status.info, status
        impostor.subscribe()
        with pytest.raises(StreamEnded) as err:
            impostor.next_signal(timeout=CALL_TIMEOUT)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.details.startswith("409: ")
        assert state_dump(path) == before
        rec = agent.list_jobs("vjob").jobs[0].agents[0]
        assert (rec.host, rec.pid, rec.subscribed) == ("localhost", 10_000, True)
        agent.next_signal(timeout=2.0, keepalive=True)  # the real agent's stream is still the live one
        assert agent.register().code == 0  # the agent itself may re-register
    finally:
        impostor.close()


# ------------------------------------------------- ClusterD-wire jobs (no ranksPerNode): --max-ranks bounds them

CLUSTERD_BOUNDS = {
    "rank at --max-ranks": ("ReportProcessFault", R.ProcessFaultRequest(jobId="cjob", faultRanks=FR({1000: 1})),
                            402, "rank 1000 is not below this controller's --max-ranks 1000"),
    "10-digit rank": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="cjob", faultRanks=[R.FaultRank(rankId="2147483647", faultType="1")]), 402, "--max-ranks 1000"),
    "fault list past --max-ranks": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="cjob", faultRanks=FR({0: 1}) * 1001), 409, "1001 entries, more than this controller's --max-ranks"),
    "stop-complete list past --max-ranks": ("ReportStopComplete", R.StopCompleteRequest(
        jobId="cjob", faultRanks=FR({0: 1}) * 1001), 409, "--max-ranks 1000"),
    "isolated rank past --max-ranks": ("ReportRecoverStatus", R.RecoverStatusRequest(
        jobId="cjob", strategy="recover", isolateRankIds=["5000"]), 402, "--max-ranks 1000"),
    "maxRestarts 2^31-1": ("Init", R.ClientInfo(jobId="cjob", maxRestarts=2**31 - 1), 409,
                           "maxRestarts 2147483647 is above 10000"),
    "17 strategies": ("Init", R.ClientInfo(jobId="cjob", strategies=["exit"] * 17), 409, "17 entries (max 16"),
    "100,000 duplicate strategies": ("ReportRecoverStrategy", R.RecoverStrategyRequest(
        jobId="cjob", strategies=["recover"] * 100_000), 409, "100000 entries (max 16"),
    "world past --max-ranks": ("Init", R.ClientInfo(jobId="big", nodeCount=11, ranksPerNode=100), 409,
                               "1100 ranks is above this controller's limit of 1000 (--max-ranks)"),
}


@pytest.fixture(scope="module")
def clusterd_env(tmp_path_factory) -> Iterator[tuple[str, Path, ScriptedAgent]]:
    path = tmp_path_factory.mktemp("state") / "ctl.sqlite3"
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.5, max_ranks=1000)
    with EmbeddedController(cfg) as ctl:
        agent = ScriptedAgent(ctl.address, "cjob", node_rank=0, node_count=1, ranks_per_node=0).join()
        yield ctl.address, path, agent
        agent.close()


@pytest.mark.parametrize("method,request_,code,words", CLUSTERD_BOUNDS.values(), ids=CLUSTERD_BOUNDS.keys())
def test_a_job_without_ranks_per_node_is_bounded_by_max_ranks_and_a_refusal_changes_nothing(
        clusterd_env, method, request_, code, words) -> None:
    address, path, agent = clusterd_env
    before_mem, before_disk = agent.list_jobs(), state_dump(path)
    with grpc.insecure_channel(address) as ch:
        status = getattr(recover_pb2_grpc.RecoverStub(ch), method)(request_, timeout=CALL_TIMEOUT)
    assert status.code == code and words in status.info, status
    assert agent.list_jobs() == before_mem and state_dump(path) == before_disk


def test_a_job_without_ranks_per_node_still_recovers_within_the_bound(clusterd_env) -> None:
    _, _, agent = clusterd_env
    assert agent.fault({999: 1}).code == 0  # the last rank --max-ranks allows
    agent.expect("stopTrain")


