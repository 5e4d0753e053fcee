"""DLRecoverManager against a tiny real gRPC server on a loopback port.

The server here is deliberately scriptable (answer codes, signals to push, silence) so that
every branch of the client can be driven; tests/e2e/client/test_client_controller.py runs the client
against the real controller.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent import futures

import grpc
import pytest
from support import free_port, wait_until
from support.client import JOB, Recorder, TinyServer

from taskd.client import current as rm
from taskd.client import retry
from taskd.client.errors import ConfigurationError, ServerUnreachable
from taskd.client.manager import DLRecoverManager, RecoverClient
from taskd.client.retry import Backoff
from taskd.client.signals import RecoverSignal
from taskd.proto import recover_pb2, recover_pb2_grpc
from taskd.vocabulary import Code

LOGGER = "taskd.client"
WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine


@pytest.fixture
def server():
    srv = TinyServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def make_manager(server):
    made: list[RecoverClient] = []

    def make(address: str | None = None, node_rank: int | None = 2, *args, **kwargs) -> RecoverClient:
        kwargs.setdefault("call_timeout", 5.0)
        kwargs.setdefault("init_timeout", 10.0)
        kwargs.setdefault("backoff_initial", 0.05)
        kwargs.setdefault("backoff_max", 0.3)
        info = recover_pb2.ClientInfo(jobId=JOB, role="master agent", nodeRank=node_rank or 0, nodeCount=3)
        manager = RecoverClient(info, address or server.address, *args, **kwargs)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.stop()


class Subscriber:
    """Runs start_subscribe in a thread, like the agent does."""

    def __init__(self, manager: RecoverClient) -> None:
        self.manager = manager
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.manager.start_subscribe("pytorch")
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def stop(self) -> float:
        started = time.monotonic()
        self.manager.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "start_subscribe did not return after stop()"
        assert self.error is None, f"start_subscribe raised {self.error!r}"
        return time.monotonic() - started


@pytest.fixture
def subscribe():
    subs: list[Subscriber] = []

    def start(manager: RecoverClient, connected: bool = True) -> Subscriber:
        """Subscribe; by default wait for the stream's greeting so that pushed signals reach it."""
        sub = Subscriber(manager)
        subs.append(sub)
        if connected:
            wait_until(lambda: manager.connected, what="subscription connected")
        return sub

    yield start
    for sub in subs:
        sub.stop()


# -- pure helpers ----------------------------------------------------------------------------------


# -- set-up calls ----------------------------------------------------------------------------------


def test_init_clusterd_retries_until_ok(server, make_manager):
    server.recorder.codes["Init"].extend([Code.NOT_INITIALISED, Code.TOO_MANY_REQUESTS])
    manager = make_manager()
    assert manager.init_clusterd() is True
    inits = server.recorder.requests("Init")
    assert len(inits) == 3
    assert inits[0].jobId == JOB and inits[0].nodeRank == 2 and inits[0].nodeCount == 3 and inits[0].pid > 0


def test_init_clusterd_recovery_disabled_returns_false(server, make_manager):
    server.recorder.codes["Init"].append(Code.RECOVERY_DISABLED)
    assert make_manager().init_clusterd() is False
    assert server.recorder.names() == ["Init"]


def test_init_clusterd_refused_409_asks_once_and_keeps_why(server, make_manager):
    server.recorder.codes["Init"].extend([Code.INVALID_PARAMS] * 3)  # asking again cannot help (issue 31, F6)
    manager = make_manager()
    assert manager.init_clusterd() is False
    assert server.recorder.names() == ["Init"]
    assert manager.init_refusal.startswith("409 ")


def test_init_clusterd_gives_up_after_bounded_attempts(server, make_manager):
    server.recorder.codes["Init"].extend([Code.TOO_MANY_JOBS] * 10)
    assert make_manager(init_attempts=3).init_clusterd() is False
    assert server.recorder.names() == ["Init"] * 3


def test_register_and_health_check(server, make_manager):
    manager = make_manager()
    status = manager.register(manager.info)
    assert status.code == 0
    assert manager.health_check().code == 0
    assert server.recorder.names() == ["Register", "HealthCheck"]
    assert server.recorder.requests("Register")[0].role == "master agent"


# -- reports ---------------------------------------------------------------------------------------


def test_reports_convert_fault_ranks_and_carry_identity(server, make_manager):
    manager = make_manager(node_rank=4)
    assert manager.report_process_fault({3: 1, "1": "0"}, detail="pid 42 killed by SIGKILL") == 0
    assert manager.report_stop_complete(0, "stopped", {3: 1}) == 0
    assert manager.report_recover_strategy({3: 1}, ["recover", "job-rescheduling", "exit"]) == 0
    assert manager.report_recover_status(0, "recovered", {3: 1}, "recover", isolate_ranks=[3]) == 0
    assert manager.report_finished(0, "all ranks exited 0") == 0

    rec = server.recorder
    fault = rec.requests("ReportProcessFault")[0]
    assert (fault.jobId, fault.nodeRank, fault.detail) == (JOB, 4, "pid 42 killed by SIGKILL")
    assert [(f.rankId, f.faultType) for f in fault.faultRanks] == [("1", "0"), ("3", "1")]
    stop = rec.requests("ReportStopComplete")[0]
    assert (stop.jobId, stop.nodeRank, stop.status.code, stop.status.info) == (JOB, 4, 0, "stopped")
    assert [(f.rankId, f.faultType) for f in stop.faultRanks] == [("3", "1")]
    strategy = rec.requests("ReportRecoverStrategy")[0]
    assert list(strategy.strategies) == ["recover", "job-rescheduling", "exit"] and strategy.nodeRank == 4
    assert [(f.rankId, f.faultType) for f in strategy.faultRanks] == [("3", "1")]
    status = rec.requests("ReportRecoverStatus")[0]
    assert (status.strategy, status.status.code, status.nodeRank) == ("recover", 0, 4)
    assert list(status.isolateRankIds) == ["3"]
    finished = rec.requests("ReportFinished")[0]
    assert (finished.jobId, finished.nodeRank, finished.exitCode, finished.message) == (JOB, 4, 0, "all ranks exited 0")


def test_report_reregisters_once_and_retries_once(server, make_manager):
    manager = make_manager()
    manager.register()
    server.recorder.calls.clear()
    server.recorder.codes["ReportProcessFault"].append(Code.NOT_REGISTERED)
    assert manager.report_process_fault({0: 1}) == 0
    assert server.recorder.names() == ["ReportProcessFault", "Register", "ReportProcessFault"]


def test_report_reinits_when_the_job_is_unknown(server, make_manager):
    server.recorder.codes["ReportStopComplete"].append(Code.JOB_NOT_EXIST)
    assert make_manager().report_stop_complete(0, "", {1: 1}) == 0
    assert server.recorder.names() == ["ReportStopComplete", "Init", "Register", "ReportStopComplete"]


def test_report_returns_the_final_code_after_one_retry(server, make_manager):
    server.recorder.codes["ReportRecoverStatus"].extend([Code.OUT_OF_ORDER, Code.OUT_OF_ORDER, 0])
    assert make_manager().report_recover_status(0, "ok", {}, "recover") == Code.OUT_OF_ORDER
    assert server.recorder.names() == ["ReportRecoverStatus", "Register", "ReportRecoverStatus"]


def test_report_refused_as_invalid_is_not_resent(server, make_manager):
    server.recorder.codes["ReportRecoverStrategy"].append(Code.INVALID_PARAMS)
    assert make_manager().report_recover_strategy({1: 1}, ["recover"]) == Code.INVALID_PARAMS
    assert server.recorder.names() == ["ReportRecoverStrategy"]


@pytest.mark.parametrize("bad", [{"x": 1}, {-1: 1}, {1: "net"}, [1, 2], {True: 1}])
def test_report_with_bad_fault_ranks_answers_409_without_a_call(server, make_manager, bad, caplog):
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert make_manager().report_process_fault(bad) == Code.INVALID_PARAMS
    assert server.recorder.names() == []
    assert "invalid arguments" in caplog.text


def test_report_with_bad_code_answers_409(server, make_manager):
    manager = make_manager()
    assert manager.report_stop_complete("zero", "", {}) == Code.INVALID_PARAMS
    assert manager.report_finished(2**40) == Code.INVALID_PARAMS
    assert server.recorder.names() == []


@pytest.mark.parametrize(
    ("strategies", "bad"),
    [(["recover", "recovr"], "'recovr'"), ("recover,bogus", "'bogus'"), (["recover", 3], "3")],
)
def test_unknown_strategy_raises_naming_it_and_the_known_ones(server, make_manager, strategies, bad):
    manager = make_manager()
    with pytest.raises(ValueError, match=bad) as info:
        manager.report_recover_strategy({1: 1}, strategies)
    assert "retry, recover, job-rescheduling, dump, exit" in str(info.value)
    with pytest.raises(ValueError, match=bad):
        rm.set_manager(manager)
        try:
            rm.report_recover_strategy({1: 1}, strategies)
        finally:
            rm.set_manager(None)
    assert server.recorder.names() == []  # nothing went on the wire


def test_strategies_are_parsed_deduplicated_in_order(server, make_manager):
    manager = make_manager()
    assert manager.report_recover_strategy({1: 1}, " recover, exit,recover ") == 0
    assert manager.report_recover_strategy({1: 1}, ["job-rescheduling", "exit", "exit"]) == 0
    sent = [list(r.strategies) for r in server.recorder.requests("ReportRecoverStrategy")]
    assert sent == [["recover", "exit"], ["job-rescheduling", "exit"]]


# -- backoff of re-sends ---------------------------------------------------------------------------

# The lower bound of every pause: Backoff's jitter (0.3 by default) shortens a delay by up to 30 %.
BACKOFF_INITIAL = 0.2
MIN_PAUSE = BACKOFF_INITIAL * (1 - Backoff().jitter) - 0.01  # 10 ms of slack for clock reads


@pytest.mark.parametrize("busy", sorted(retry.BUSY_CODES))
def test_busy_answers_are_resent_after_spaced_pauses(server, make_manager, busy):
    server.recorder.codes["ReportProcessFault"].extend([busy] * 3)
    manager = make_manager(backoff_initial=BACKOFF_INITIAL, backoff_max=1.0, report_timeout=WAIT)
    assert manager.report_process_fault({0: 1}) == 0
    assert server.recorder.names() == ["ReportProcessFault"] * 4  # busy: no re-register, just wait
    arrivals = server.recorder.arrivals("ReportProcessFault")
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert all(gap >= MIN_PAUSE for gap in gaps), gaps
    # capped exponential: the third pause is at least the doubled-twice base, jitter included
    assert gaps[2] >= 4 * BACKOFF_INITIAL * (1 - Backoff().jitter) - 0.01, gaps


def test_not_registered_answers_reregister_after_a_pause_each_time(server, make_manager):
    manager = make_manager(backoff_initial=BACKOFF_INITIAL, backoff_max=1.0, report_timeout=WAIT)
    server.recorder.codes["ReportStopComplete"].extend([Code.NOT_REGISTERED, Code.NOT_REGISTERED])
    assert manager.report_stop_complete(0, "", {1: 1}) == 0
    assert server.recorder.names() == ["ReportStopComplete", "Register"] * 2 + ["ReportStopComplete"]
    reports = server.recorder.arrivals("ReportStopComplete")
    registers = server.recorder.arrivals("Register")
    assert registers[0] - reports[0] >= MIN_PAUSE  # the pause comes before the re-register too
    assert registers[1] - reports[1] >= MIN_PAUSE


def test_always_busy_returns_the_busy_code_within_the_deadline(server, make_manager, caplog):
    server.recorder.codes["ReportRecoverStatus"].extend([Code.TOO_MANY_REQUESTS] * 1000)
    manager = make_manager(backoff_initial=0.05, backoff_max=0.2, report_timeout=1.5)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert manager.report_recover_status(0, "ok", {}, "recover") == Code.TOO_MANY_REQUESTS
    elapsed = time.monotonic() - started
    # lower bound only: it did keep trying for a good part of its deadline rather than giving up at once
    assert elapsed >= 1.5 - 0.2 - 0.05, elapsed
    sent = server.recorder.names()
    assert len(sent) >= 3 and set(sent) == {"ReportRecoverStatus"}
    assert "no time left within its 1.5s deadline" in caplog.text


def test_report_timeout_is_validated(make_manager):
    with pytest.raises(ConfigurationError, match="report_timeout"):
        make_manager(report_timeout=0)


# -- unreachable server ----------------------------------------------------------------------------


def test_unreachable_server_raises_naming_the_address(make_manager):
    address = f"127.0.0.1:{free_port()}"
    manager = make_manager(address=address, call_timeout=0.5, init_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(ServerUnreachable, match=address) as info:
        manager.report_process_fault({0: 1})
    assert info.value.address == address
    with pytest.raises(ServerUnreachable, match=address):
        manager.init_clusterd()
    with pytest.raises(ServerUnreachable, match=address):
        manager.health_check()
    assert time.monotonic() - started < WAIT  # bounded, not a hang


def test_unreachable_without_wait_for_ready_fails_fast(make_manager):
    address = f"127.0.0.1:{free_port()}"
    manager = make_manager(address=address, wait_for_ready=False, call_timeout=5.0)
    with pytest.raises(ServerUnreachable, match=address):
        manager.register()


# -- signals ---------------------------------------------------------------------------------------


def test_dispatch_by_signal_type_then_each_action(server, make_manager, subscribe):
    manager = make_manager()
    manager.register()
    seen: list[tuple[str, RecoverSignal]] = []
    for name in ("globalFault", "stop_train", "on_global_rank", "killMaster"):
        manager.register_action_handler(name, lambda sig, name=name: seen.append((name, sig)))
    subscribe(manager)
    wait_until(lambda: manager.connected, what="connected")
    server.recorder.push(uuid="u1", signalType="globalFault", actions=["stop_train", "on_global_rank"])
    server.recorder.push(uuid="u2", signalType="killMaster")
    wait_until(lambda: len(seen) == 4, what="4 dispatches")
    assert [(name, sig.uuid) for name, sig in seen] == [
        ("globalFault", "u1"),
        ("stop_train", "u1"),
        ("on_global_rank", "u1"),
        ("killMaster", "u2"),
    ]


def test_signal_is_parsed_for_handlers(server, make_manager, subscribe):
    manager = make_manager()
    manager.register()
    got: list[RecoverSignal] = []
    manager.register_action_handler("change_strategy", got.append)
    subscribe(manager)
    server.recorder.push(
        uuid="u-9",
        signalType="changeStrategy",
        actions=["change_strategy"],
        faultRanks=[recover_pb2.FaultRank(rankId="5", faultType="2"), recover_pb2.FaultRank(rankId="7", faultType="0")],
        changeStrategy="recover",
        timeout=30,
        nodeRankIds=["0", "2"],
        extraParams='{"k": 1}',
    )
    wait_until(lambda: got, what="change_strategy")
    sig = got[0]
    assert (sig.uuid, sig.job_id, sig.signal_type, sig.actions) == ("u-9", JOB, "changeStrategy", ["change_strategy"])
    assert sig.fault_ranks == {5: 2, 7: 0}
    assert (sig.strategy, sig.timeout, sig.node_ranks, sig.extra_params) == ("recover", 30, [0, 2], '{"k": 1}')
    assert isinstance(sig.raw, recover_pb2.ProcessManageSignal) and sig.raw.uuid == "u-9"


def test_unknown_action_is_logged_and_raising_handler_keeps_the_stream(server, make_manager, subscribe, caplog):
    manager = make_manager()
    manager.register()
    delivered: list[str] = []

    def boom(sig: RecoverSignal) -> None:
        raise RuntimeError("handler exploded")

    manager.register_action_handler("stop_train", boom)
    manager.register_action_handler("on_global_rank", lambda sig: delivered.append(sig.uuid))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        subscribe(manager)
        server.recorder.push(uuid="a", signalType="stopTrain", actions=["stop_train", "teleport", "on_global_rank"])
        server.recorder.push(uuid="b", signalType="globalFault", actions=["on_global_rank"])
        wait_until(lambda: delivered == ["a", "b"], what="both signals")
    assert "no handler registered for action 'teleport'" in caplog.text
    assert "handler exploded" in caplog.text
    assert server.recorder.subscriptions == 1  # the same stream carried both signals


def test_signal_for_another_job_is_dropped(server, make_manager, subscribe, caplog):
    manager = make_manager()
    manager.register()
    got: list[str] = []
    manager.register_action_handler("stop_train", lambda sig: got.append(sig.uuid))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        subscribe(manager)
        server.recorder.push(uuid="other", jobId="job-2", signalType="stopTrain", actions=["stop_train"])
        server.recorder.push(uuid="mine", signalType="stopTrain", actions=["stop_train"])
        wait_until(lambda: got, what="own signal")
    assert got == ["mine"]
    assert "dropping stopTrain signal other for job 'job-2'" in caplog.text


def test_keep_alive_feeds_liveness(server, make_manager, subscribe):
    manager = make_manager()
    manager.register()
    alive: list[str] = []
    manager.register_action_handler("keep-alive", lambda sig: alive.append(sig.uuid))
    assert not manager.connected and manager.last_signal_time is None
    subscribe(manager)
    first = manager.last_signal_time
    server.recorder.push(uuid="ka-2", signalType="keep-alive")
    wait_until(lambda: "ka-2" in alive, what="second keep-alive")
    assert manager.last_signal_time >= first


def test_silent_stream_is_reopened_after_liveness_timeout(server, make_manager, subscribe):
    server.recorder.greet = False  # never sends anything
    manager = make_manager(liveness_timeout=0.5)
    manager.register()
    subscribe(manager, connected=False)
    wait_until(lambda: server.recorder.subscriptions >= 2, what="a second subscription")
    names = server.recorder.names()
    second = [i for i, n in enumerate(names) if n == "Subscribe"][1]
    assert names[second - 2 : second] == ["Init", "Register"]
    assert not manager.connected


def test_long_handler_is_not_mistaken_for_a_dead_stream(server, make_manager, subscribe):
    manager = make_manager(liveness_timeout=0.5)
    manager.register()
    release = threading.Event()
    done: list[str] = []

    def slow(sig: RecoverSignal) -> None:
        release.wait(WAIT)
        done.append(sig.uuid)

    manager.register_action_handler("stop_train", slow)
    subscribe(manager)
    server.recorder.push(uuid="slow", signalType="stopTrain", actions=["stop_train"])
    time.sleep(1.5)  # three liveness periods inside the handler
    release.set()
    wait_until(lambda: done == ["slow"], what="slow handler")
    assert server.recorder.subscriptions == 1


def test_handler_may_report_synchronously(server, make_manager, subscribe):
    """Handlers run on the subscription's event loop; the blocking report calls work from there too."""
    manager = make_manager()
    manager.register()
    codes: list[int] = []
    manager.register_action_handler("stop_train", lambda sig: codes.append(manager.report_stop_complete(0, "", {1: 1})))
    subscribe(manager)
    server.recorder.push(uuid="s", signalType="stopTrain", actions=["stop_train"], faultRanks=[
        recover_pb2.FaultRank(rankId="1", faultType="1")])
    wait_until(lambda: codes, what="report from inside the handler")
    assert codes == [0]
    assert server.recorder.requests("ReportStopComplete")[0].faultRanks[0].rankId == "1"
    assert manager.connected


def test_first_subscribe_inits_and_registers_when_not_registered(server, make_manager, subscribe):
    manager = make_manager()
    subscribe(manager)
    wait_until(lambda: "Subscribe" in server.recorder.names(), what="subscription")
    assert server.recorder.names()[:3] == ["Init", "Register", "Subscribe"]


def test_frame_is_logged_and_changes_nothing_on_the_wire(server, make_manager, caplog):
    manager = make_manager()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        thread = threading.Thread(target=manager.start_subscribe, kwargs={"frame": "mindspore"}, daemon=True)
        thread.start()
        wait_until(lambda: manager.connected, what="subscription connected")
        manager.stop()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert manager.frame == "mindspore"
    assert "(frame mindspore)" in caplog.text
    # ClientInfo has no frame field: what the controller sees is the manager's info, unchanged
    subscribed = server.recorder.requests("Subscribe")[0]
    assert subscribed == manager.info


def test_reconnects_after_server_restart_on_the_same_port(server, make_manager, subscribe):
    manager = make_manager()
    assert manager.init_clusterd() and manager.register().code == 0
    got: list[str] = []
    manager.register_action_handler("stop_train", lambda sig: got.append(sig.uuid))
    subscribe(manager)
    wait_until(lambda: server.recorder.subscriptions == 1 and manager.connected, what="first subscription")
    server.recorder.push(uuid="before", signalType="stopTrain", actions=["stop_train"])
    wait_until(lambda: got == ["before"], what="signal before restart")

    server.stop()
    wait_until(lambda: not manager.connected, what="disconnect noticed")
    server.recorder.calls.clear()
    server.start()  # same port, same recorder
    wait_until(lambda: server.recorder.subscriptions == 2 and manager.connected, what="resubscription")
    assert server.recorder.names()[:3] == ["Init", "Register", "Subscribe"]
    server.recorder.push(uuid="after", signalType="stopTrain", actions=["stop_train"])
    wait_until(lambda: got == ["before", "after"], what="signal after restart")


def test_stop_returns_promptly_while_subscribed(server, make_manager, subscribe):
    manager = make_manager()
    manager.register()
    sub = subscribe(manager)
    wait_until(lambda: manager.connected, what="connected")
    assert sub.stop() < WAIT
    assert not manager.connected
    # reports still work after stop(): a fresh channel is opened for them
    assert manager.report_process_fault({0: 1}) == 0


def test_stop_returns_promptly_while_server_is_down(make_manager, subscribe):
    manager = make_manager(address=f"127.0.0.1:{free_port()}", call_timeout=30.0, init_timeout=60.0)
    sub = subscribe(manager, connected=False)
    time.sleep(0.5)  # inside a wait-for-ready Init with a long deadline
    assert sub.stop() < WAIT


def test_stop_from_a_handler_ends_the_subscription(server, make_manager, subscribe):
    manager = make_manager()
    manager.register()
    manager.register_action_handler("killMaster", lambda sig: manager.stop())
    sub = subscribe(manager)
    server.recorder.push(uuid="k", signalType="killMaster")
    sub.thread.join(WAIT)
    assert not sub.thread.is_alive()


def test_register_action_handler_validates(make_manager):
    manager = make_manager()
    with pytest.raises(ValueError):
        manager.register_action_handler("", print)
    with pytest.raises(TypeError):
        manager.register_action_handler("stop_train", "not callable")  # type: ignore[arg-type]


def test_unknown_handler_name_is_refused_naming_the_known_ones(make_manager):
    manager = make_manager()
    with pytest.raises(ValueError, match="'nonsense'") as info:
        manager.register_action_handler("nonsense", print)
    for known in ("stop_train", "change_strategy", "killMaster", "keep-alive"):
        assert known in str(info.value)


def test_unknown_frame_is_refused_before_subscribing(server, make_manager):
    manager = make_manager()
    with pytest.raises(ValueError, match="'bogus'.*pytorch, mindspore"):
        manager.start_subscribe(frame="bogus")
    assert server.recorder.names() == []  # nothing was called


def test_automatic_reregister_keeps_host_and_pid(server, make_manager):
    """TaskD users register with a ClientInfo of their own, without host and pid (issue 13)."""
    import os
    import socket

    manager = make_manager()
    assert manager.register(recover_pb2.ClientInfo(jobId=JOB, role="master agent", nodeRank=2)).code == 0
    server.recorder.codes["ReportRecoverStatus"].append(Code.OUT_OF_ORDER)
    assert manager.report_recover_status(0, "ok", {}, "recover") == 0
    registers = server.recorder.requests("Register")
    assert len(registers) == 2
    for request in registers:
        assert (request.host, request.pid) == (socket.gethostname(), os.getpid())


# -- module functions ------------------------------------------------------------------------------


def test_module_functions_build_the_manager_from_env(server, monkeypatch, no_current_manager):
    monkeypatch.setenv("MINDX_TASK_ID", JOB)
    monkeypatch.setenv("MINDX_SERVER_IP", server.address)
    monkeypatch.setenv("TASKD_NODE_RANK", "1")
    assert rm.report_process_fault({6: 1}) == 0
    assert rm.report_stop_complete(0, "ok", {6: 1}) == 0
    assert rm.report_recover_strategy({6: 1}, ["exit"]) == 0
    assert rm.report_recover_status(0, "ok", {6: 1}, "exit") == 0
    assert rm.report_finished(1, "rank 6 failed") == 0
    assert rm.get_manager() is rm.get_manager()
    fault = server.recorder.requests("ReportProcessFault")[0]
    assert (fault.jobId, fault.nodeRank, [(f.rankId, f.faultType) for f in fault.faultRanks]) == (JOB, 1, [("6", "1")])
    assert server.recorder.requests("ReportFinished")[0].exitCode == 1


def test_module_functions_use_the_manager_that_was_set(server, make_manager, monkeypatch, no_current_manager):
    monkeypatch.delenv("MINDX_TASK_ID", raising=False)
    monkeypatch.delenv("MINDX_SERVER_IP", raising=False)
    manager = make_manager(node_rank=9)
    rm.set_manager(manager)
    assert rm.get_manager() is manager
    assert rm.report_process_fault({0: 2}) == 0
    assert server.recorder.requests("ReportProcessFault")[0].nodeRank == 9


# -- TLS (TaskD's secure_conn / cert_path) ---------------------------------------------------------


def test_secure_channel_with_a_ca_certificate(tmp_path, make_manager):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    recorder = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    recover_pb2_grpc.add_RecoverServicer_to_server(recorder, server)
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    )
    server.start()
    try:
        manager = make_manager(f"127.0.0.1:{port}", None, True, str(cert))
        assert manager.register().code == 0
        assert recorder.names() == ["Register"]
        sub = Subscriber(manager)  # the signal stream's own (asyncio) channel uses TLS too
        wait_until(lambda: manager.connected, what="subscribed over TLS")
        sub.stop()
        assert recorder.names() == ["Register", "Subscribe"]
        plain = make_manager(f"127.0.0.1:{port}", call_timeout=1.0)
        with pytest.raises(ServerUnreachable):
            plain.register()  # an insecure client cannot talk to a TLS server
    finally:
        server.stop(grace=0).wait(WAIT)
    with pytest.raises(ConfigurationError, match="cert_path"):
        DLRecoverManager(recover_pb2.ClientInfo(jobId=JOB), "127.0.0.1", True, str(tmp_path / "missing.pem"))


def test_the_stream_loop_stays_responsive_while_the_resync_blocks(make_manager):
    """The resync (blocking Init/Register calls) runs in the loop's worker thread, not in a coroutine."""
    import asyncio

    release, entered = threading.Event(), threading.Event()

    class SlowInit(Recorder):
        def Init(self, request, context):
            entered.set()
            release.wait(WAIT)
            return super().Init(request, context)

    slow = TinyServer(SlowInit()).start()
    try:
        manager = make_manager(address=slow.address, call_timeout=WAIT, init_timeout=WAIT)
        sub = Subscriber(manager)  # never registered: the first thing it does is Init, which now hangs
        assert entered.wait(WAIT), "the subscription never called Init"
        loop = manager._subscription._loop
        assert loop is not None
        ping = asyncio.run_coroutine_threadsafe(asyncio.sleep(0, result="pong"), loop)
        assert ping.result(timeout=WAIT) == "pong"  # the loop ran it while Init was still unanswered
        assert "Init" not in slow.recorder.names()
        release.set()
        wait_until(lambda: manager.connected, what="subscribed after the slow Init")
        assert slow.recorder.names()[:3] == ["Init", "Register", "Subscribe"]
        sub.stop()
    finally:
        release.set()
        slow.stop()


EXIT_CHILD = r"""
import sys, threading
from taskd.client import RecoverClient
from taskd.proto import recover_pb2

mgr = RecoverClient(recover_pb2.ClientInfo(jobId=sys.argv[2], role="agent"), sys.argv[1], call_timeout=5.0)
entered = threading.Event()
mgr.register_action_handler("stop_train", lambda sig: (entered.set(), threading.Event().wait()))
assert mgr.register().code == 0
threading.Thread(target=mgr.start_subscribe, daemon=True).start()
print("ready", flush=True)
assert entered.wait(20), "the handler never ran"
print("exiting with a handler in flight", flush=True)
"""


def test_a_handler_in_flight_does_not_hold_up_the_process_exit(server):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", EXIT_CHILD, server.address, JOB], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        wait_until(lambda: server.recorder.subscriptions == 1, what="the child's subscription")
        server.recorder.push(uuid="stuck", signalType="stopTrain", actions=["stop_train"])
        assert child.wait(WAIT) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT)
