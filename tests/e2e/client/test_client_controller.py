"""The client (RecoverClient, DLRecoverManager) driving the real controller (taskd.controller) on a loopback port."""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time

import grpc
import pytest
from support import wait_until

import taskd
from taskd.client import RecoverClient, RecoverSignal, ServerUnreachable
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code

WAIT = 20.0
LOGGER = "taskd.client"
HANDLED = ("stop_train", "on_global_rank", "change_strategy", "save_and_exit", "killMaster")


def controller_config(listen: str = "127.0.0.1:0", state_path: str = ":memory:") -> ControllerConfig:
    return ControllerConfig(listen=listen, state_path=state_path, keepalive_interval=0.2)


@pytest.fixture
def controller():
    ctl = EmbeddedController(controller_config())
    ctl.start()
    yield ctl
    ctl.stop()


class Agent:
    """A manager whose handlers queue what they receive; subscribed in its own thread."""

    def __init__(self, address: str, job_id: str, node_rank: int, node_count: int, **kwargs) -> None:
        kwargs.setdefault("call_timeout", 5.0)
        kwargs.setdefault("backoff_initial", 0.05)
        kwargs.setdefault("backoff_max", 0.5)
        kwargs.setdefault("liveness_timeout", 3.0)
        info = recover_pb2.ClientInfo(
            jobId=job_id, role="agent", nodeRank=node_rank, nodeCount=node_count, ranksPerNode=2
        )
        self.mgr = RecoverClient(info, address, **kwargs)  # several agents in one process
        self.signals: queue.Queue[tuple[str, RecoverSignal]] = queue.Queue()
        for name in HANDLED:
            self.mgr.register_action_handler(name, lambda sig, name=name: self.signals.put((name, sig)))
        self.thread: threading.Thread | None = None

    def join(self) -> Agent:
        assert self.mgr.init_clusterd() is True
        assert self.mgr.register().code == Code.OK
        return self.subscribe()

    def subscribe(self) -> Agent:
        self.thread = threading.Thread(target=self.mgr.start_subscribe, daemon=True)
        self.thread.start()
        wait_until(lambda: self.mgr.connected, what=f"node {self.mgr.info.nodeRank} connected")
        return self

    def expect(self, name: str) -> RecoverSignal:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                got, sig = self.signals.get(timeout=0.1)
            except queue.Empty:
                continue
            if got == name:
                return sig
        raise AssertionError(f"node {self.mgr.info.nodeRank} got no {name!r} within {WAIT}s")

    def close(self) -> None:
        self.mgr.stop()
        if self.thread is not None:
            self.thread.join(WAIT)
            assert not self.thread.is_alive(), "start_subscribe did not return after stop()"


@pytest.fixture
def agents():
    made: list[Agent] = []

    def make(address: str, job_id: str = "job-c", node_rank: int = 0, node_count: int = 1, **kw) -> Agent:
        agent = Agent(address, job_id, node_rank, node_count, **kw)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


def list_job(address: str, job_id: str) -> taskd_pb2.JobRecord:
    with grpc.insecure_channel(address) as channel:
        jobs = taskd_pb2_grpc.JobStatusStub(channel).ListJobs(taskd_pb2.JobQuery(jobId=job_id), timeout=WAIT)
    assert len(jobs.jobs) == 1, jobs
    return jobs.jobs[0]


def test_full_recover_round_with_two_agents(controller, agents):
    a0 = agents(controller.address, node_rank=0, node_count=2).join()
    a1 = agents(controller.address, node_rank=1, node_count=2).join()

    assert a1.mgr.report_process_fault({3: 1}, detail="pid 99 killed by SIGKILL") == Code.OK
    for agent in (a0, a1):
        sig = agent.expect("stop_train")
        assert sig.fault_ranks == {3: 1} and sig.signal_type == "stopTrain"
    for agent in (a0, a1):
        assert agent.mgr.report_stop_complete(0, "stopped", {3: 1}) == Code.OK
    for agent in (a0, a1):
        assert agent.expect("on_global_rank").fault_ranks == {3: 1}
    for agent in (a0, a1):
        assert agent.mgr.report_recover_strategy({3: 1}, ["recover", "job-rescheduling", "exit"]) == Code.OK
    for agent in (a0, a1):
        sig = agent.expect("change_strategy")
        assert sig.strategy == "recover" and sig.fault_ranks == {3: 1}
    for agent in (a0, a1):
        assert agent.mgr.report_recover_status(0, "restarted", {3: 1}, "recover") == Code.OK

    wait_until(lambda: list_job(controller.address, "job-c").state == "RUNNING", what="job RUNNING again")
    job = list_job(controller.address, "job-c")
    assert [(r.strategy, r.outcome) for r in job.rounds] == [("recover", "recovered")]
    assert {a.nodeRank for a in job.agents} == {0, 1}
    assert a0.mgr.report_finished(0) == Code.OK and a1.mgr.report_finished(0) == Code.OK
    wait_until(lambda: list_job(controller.address, "job-c").state == "SUCCEEDED", what="job SUCCEEDED")


def test_report_from_unknown_job_reinits_registers_and_retries(controller, agents, caplog):
    agent = agents(controller.address, job_id="job-late")
    assert agent.mgr.health_check().code == Code.NOT_REGISTERED
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert agent.mgr.report_process_fault({0: 1}) == Code.OK
    assert "ReportProcessFault answered 402" in caplog.text
    assert "re-init of job job-late answered 0" in caplog.text
    assert agent.mgr.health_check().code == Code.OK


def test_report_from_unregistered_agent_registers_and_retries(controller, agents):
    agents(controller.address, node_rank=0, node_count=2).join()
    late = agents(controller.address, node_rank=1, node_count=2)
    assert late.mgr.health_check().code == Code.NOT_REGISTERED
    assert late.mgr.report_process_fault({2: 1}) == Code.OK  # 400 -> Register, retry
    assert late.mgr.health_check().code == Code.OK


def test_invalid_report_gets_the_controllers_409(controller, agents):
    agent = agents(controller.address).join()
    # fault type 7 is a number, so the client sends it; the controller knows only 0, 1 and 2
    assert agent.mgr.report_process_fault({0: 7}) == Code.INVALID_PARAMS
    assert agent.mgr.health_check().code == Code.OK  # the controller keeps serving


def test_unknown_strategy_is_refused_before_the_wire(controller, agents):
    agent = agents(controller.address).join()
    with pytest.raises(ValueError, match="'teleport'.*known: retry, recover, job-rescheduling, dump, exit"):
        agent.mgr.report_recover_strategy({0: 1}, ["recover", "teleport"])
    assert agent.mgr.health_check().code == Code.OK


def test_client_resubscribes_after_controller_restart(tmp_path, agents):
    state = str(tmp_path / "state.db")
    first = EmbeddedController(controller_config(state_path=state))
    address = first.start()
    second = EmbeddedController(controller_config(listen=address, state_path=state))
    try:
        agent = agents(address).join()
        first.stop()
        wait_until(lambda: not agent.mgr.connected, what="disconnect noticed")
        assert second.start() == address
        wait_until(lambda: agent.mgr.connected, what="resubscribed to the restarted controller")
        assert agent.mgr.health_check().code == Code.OK
        assert agent.mgr.report_process_fault({1: 1}) == Code.OK
        assert agent.expect("stop_train").fault_ranks == {1: 1}
    finally:
        first.stop()
        second.stop()


def test_keep_alives_keep_a_quiet_stream_open(controller, agents, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        agent = agents(controller.address, liveness_timeout=1.0).join()
        first = agent.mgr.last_signal_time
        time.sleep(2.5)  # longer than the liveness timeout; only keep-alives arrive
        assert agent.mgr.connected
        assert agent.mgr.last_signal_time > first
    assert "reopening the signal stream" not in caplog.text


def test_unreachable_after_controller_stops(agents):
    ctl = EmbeddedController(controller_config())
    address = ctl.start()
    agent = agents(address, call_timeout=1.0).join()
    ctl.stop()
    with pytest.raises(ServerUnreachable, match=address):
        agent.mgr.report_process_fault({0: 1})


# -- cost of an idle subscription ------------------------------------------------------------------

IDLE_CHILD = r"""
import sys, threading, time
from taskd.proto import recover_pb2
from taskd.python.toolkit.recover_module.recover_manager import DLRecoverManager

info = recover_pb2.ClientInfo(jobId="job-idle", role="agent", nodeRank=0, nodeCount=1, ranksPerNode=8)
mgr = DLRecoverManager(info, sys.argv[1])
assert mgr.init_clusterd() and mgr.register().code == 0
thread = threading.Thread(target=mgr.start_subscribe, name="subscriber", daemon=True)
thread.start()
deadline = time.monotonic() + 30
while not mgr.connected and time.monotonic() < deadline:
    time.sleep(0.05)
print(thread.native_id if mgr.connected else "not-connected", flush=True)
sys.stdin.readline()
print("|".join(t.name for t in threading.enumerate()), flush=True)
mgr.stop()
thread.join(10)
print("stopped" if not thread.is_alive() else "still-running", flush=True)
"""


def thread_usage(pid: int, tid: int) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches = times it went to sleep) of one thread."""
    cpu_ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
    status = open(f"/proc/{pid}/task/{tid}/status").read()
    sleeps = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return cpu_ns / 1e9, sleeps


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc per-thread statistics")
def test_idle_subscription_does_not_poll():
    """An idle subscribed manager sleeps between keep-alives instead of polling.

    The former synchronous stream woke its thread every 100 ms (about 50 sleeps and 6 ms CPU per
    5 s) and ran a channel spin thread and a liveness thread; the asyncio stream sleeps until a
    message or the liveness deadline (a few sleeps per 5 s).
    """
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:"))  # keep-alive every 5 s
    address = ctl.start()
    root = os.path.dirname(os.path.dirname(os.path.abspath(taskd.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, "-c", IDLE_CHILD, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        first = child.stdout.readline().strip()
        assert first.isdigit(), f"child did not subscribe: {first!r}"
        tid = int(first)
        time.sleep(0.5)  # past the first keep-alive's dispatch
        cpu0, sleeps0 = thread_usage(child.pid, tid)
        time.sleep(5.0)
        cpu1, sleeps1 = thread_usage(child.pid, tid)
        child.stdin.write("\n")
        child.stdin.flush()
        names = child.stdout.readline().strip().split("|")
        assert child.stdout.readline().strip() == "stopped"
        assert child.wait(WAIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT)
        ctl.stop()
    cpu, sleeps = cpu1 - cpu0, sleeps1 - sleeps0
    logging.getLogger(__name__).info("idle subscriber over 5 s: %.2f ms CPU, %d sleeps", cpu * 1e3, sleeps)
    assert sleeps < 25, f"the subscriber thread woke {sleeps} times in 5 s of idling (polling?)"
    assert cpu < 0.030, f"the subscriber thread used {cpu * 1e3:.1f} ms CPU in 5 s of idling"
    assert not [n for n in names if "channel_spin" in n or "liveness" in n], names
