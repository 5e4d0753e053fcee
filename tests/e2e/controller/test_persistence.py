"""State survives the controller: a graceful restart, a SIGKILL, and the store's own tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, ControllerServer, EmbeddedController
from taskd.launcher.spec import free_port

REPO = Path(__file__).resolve().parents[3]
ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def config(path: Path, port: int = 0) -> ControllerConfig:
    return ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(path), keepalive_interval=0.3,
                            stop_timeout=60, strategy_timeout=60, recover_timeout=60, resume_timeout=60)


def answer_round(agents: list[ScriptedAgent], strategy: str, report: bool = True) -> None:
    """Every agent through a round from its stopTrain to `strategy` chosen (and reported done, with `report`)."""
    for a in agents:
        a.expect("stopTrain")
    for a in agents:
        ok(a.stop_complete())
    for a in agents:
        a.expect("globalFault")
    for a in agents:
        ok(a.strategies(ALL))
    for a in agents:
        a.expect("changeStrategy", strategy)
    if report:
        for a in agents:
            ok(a.status(strategy))


def recover_round(agents: list[ScriptedAgent], fault: dict[int, int]) -> None:
    ok(agents[0].fault(fault))
    answer_round(agents, "recover")


def test_restart_keeps_jobs_and_resumes_the_open_round(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    first = EmbeddedController(config(state))
    addr = first.start()
    done = [ScriptedAgent(addr, "done", n, 2).join() for n in range(2)]
    recover_round(done, {0: 1})  # node 0 reports its own rank
    mid = [ScriptedAgent(addr, "mid", n, 2, ranks_per_node=2).join() for n in range(2)]  # rank 3 is node 1's
    ok(mid[1].fault({3: 1}, detail="rank 3 exited -9"))
    for a in mid:
        a.expect("stopTrain")
    ok(mid[0].stop_complete())
    for a in done + mid:
        a.close()
    first.stop()

    second = EmbeddedController(config(state))
    addr = second.start()
    try:
        again = [ScriptedAgent(addr, "mid", n, 2, ranks_per_node=2) for n in range(2)]  # same host and pid as before
        status = again[0].init()
        assert status.code == 0 and "joined" in status.info  # a known agent rejoins; nothing is wiped
        jobs = {j.jobId: j for j in again[0].list_jobs().jobs}
        assert jobs["done"].state == "RUNNING" and jobs["done"].rounds[0].outcome == "recovered"
        assert jobs["done"].restarts == 1
        assert jobs["mid"].state == "RESUMING"
        assert [(f.rankId, f.faultType) for f in jobs["mid"].rounds[0].faultRanks] == [("3", "1")]
        ok(again[0].health())  # agents are remembered: no Register needed
        again[0].subscribe()
        again[0].no_signal()  # waits for every agent before restarting the round
        again[1].subscribe()
        for a in again:
            sig = a.expect("stopTrain")
            assert [f.rankId for f in sig.faultRanks] == ["3"]
        for a in again:
            ok(a.stop_complete())
        for a in again:
            a.expect("globalFault")
        for a in again:
            a.close()
        job = ScriptedAgent(addr, "x").list_jobs("mid").jobs[0]
        assert job.state == "COLLECTING" and len(job.rounds) == 1
        assert "round_resumed" in [e.kind for e in job.events]
    finally:
        second.stop()


def test_real_client_reconnects_after_the_controller_restarts(tmp_path: Path) -> None:
    import queue
    import threading

    from taskd.client import RecoverClient as DLRecoverManager  # two clients in one process: not the singleton
    from taskd.proto import recover_pb2

    state, port = tmp_path / "ctl.sqlite3", free_port()
    ctl = EmbeddedController(config(state, port))
    addr = ctl.start()
    managers, inboxes, threads = [], [], []
    for n in range(2):
        info = recover_pb2.ClientInfo(jobId="rc", role="agent", nodeRank=n, nodeCount=2, ranksPerNode=1)
        mgr = DLRecoverManager(info, addr, backoff_initial=0.05, backoff_max=0.3, liveness_timeout=5, call_timeout=5)
        inbox: queue.Queue = queue.Queue()
        for action in ("stop_train", "on_global_rank", "change_strategy"):
            mgr.register_action_handler(action, inbox.put)
        assert mgr.init_clusterd()
        ok(mgr.register())
        t = threading.Thread(target=mgr.start_subscribe, daemon=True)
        t.start()
        managers.append(mgr)
        inboxes.append(inbox)
        threads.append(t)

    def expect(action: str) -> None:
        for inbox in inboxes:
            sig = inbox.get(timeout=30)
            assert action in sig.actions, sig

    try:
        deadline = time.monotonic() + 30
        while not all(m.connected for m in managers):
            assert time.monotonic() < deadline, "clients never subscribed"
            time.sleep(0.05)
        assert managers[1].report_process_fault({1: 1}) == 0
        expect("stop_train")
        assert managers[0].report_stop_complete(0, "", {1: 1}) == 0
        ctl.stop()
        ctl = EmbeddedController(config(state, port))
        ctl.start()
        expect("stop_train")  # both clients came back by themselves; the round restarted
        for m in managers:
            assert m.report_stop_complete(0, "", {1: 1}) == 0
        expect("on_global_rank")
        for m in managers:
            assert m.report_recover_strategy({1: 1}, ["recover", "exit"]) == 0
        expect("change_strategy")
        for m in managers:
            assert m.report_recover_status(0, "", {1: 1}, "recover") == 0
        job = ScriptedAgent(addr, "x").list_jobs("rc").jobs[0]
        assert job.state == "RUNNING" and job.rounds[0].outcome == "recovered"
    finally:
        for m in managers:
            m.stop()
        for t in threads:
            t.join(10)
        ctl.stop()


def start_subprocess(state: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskd.controller", "--listen", "127.0.0.1:0", "--state", str(state),
         "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )
    line = proc.stdout.readline()  # "taskd controller listening on HOST:PORT"; EOF if it died
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"controller did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split()[-1]


def test_sigkill_right_after_an_answer_loses_nothing(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    proc, addr = start_subprocess(state)
    try:
        agents = [ScriptedAgent(addr, "k", n, 2).join() for n in range(2)]
        ok(agents[0].fault({0: 1}))
        ok(agents[1].stop_complete())  # the last thing acknowledged
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for a in agents:
            a.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    proc, addr = start_subprocess(state)
    try:
        job = ScriptedAgent(addr, "x").list_jobs("k").jobs[0]
        assert job.state == "RESUMING" and [a.nodeRank for a in job.agents] == [0, 1]
        assert [(f.rankId, f.faultType) for f in job.rounds[0].faultRanks] == [("0", "1")]
        acked = [e for e in job.events if e.kind == "stop_complete"]
        assert len(acked) == 1 and '"node_rank": 1' in acked[0].detail
        proc.send_signal(signal.SIGTERM)  # graceful shutdown ends with exit code 0
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_second_controller_on_a_taken_port_fails_clearly(tmp_path: Path) -> None:
    import asyncio

    with EmbeddedController(config(tmp_path / "a.sqlite3")) as ctl:
        port = int(ctl.address.rsplit(":", 1)[1])
        server = ControllerServer(config(tmp_path / "b.sqlite3", port))
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            asyncio.run(server.start())
        with pytest.raises(OSError):
            EmbeddedController(config(tmp_path / "c.sqlite3", port)).start()


# A job caught mid-round (recover failed, job-rescheduling under way, a fault queued), as the state machine
# wrote it before it was split into modules: state files of that version must keep loading.


def test_sigkill_during_recovering_charges_the_restart_once(tmp_path: Path) -> None:
    """L4, issue 31 F2: the controller dies after choosing job-rescheduling (one restart spent); the restarted
    controller resumes the round where it was: each agent that owes its status gets the same changeStrategy again,
    nothing is chosen or charged again, and the budget shows one restart."""
    state = tmp_path / "ctl.sqlite3"
    proc, addr = start_subprocess(state)
    try:
        agents = [ScriptedAgent(addr, "l4", n, 2) for n in range(2)]
        for a in agents:
            a.join(max_restarts=1)  # the interrupted restart is the last one the job may spend
        ok(agents[0].fault({0: 2}))  # a network fault: job-rescheduling
        answer_round(agents, "job-rescheduling", report=False)
        assert agents[0].list_jobs("l4").jobs[0].restarts == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        for a in agents:
            a.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    proc, addr = start_subprocess(state)
    try:
        agents = [ScriptedAgent(addr, "l4", n, 2) for n in range(2)]  # the same processes, reconnecting
        for a in agents:
            ok(a.init())
            ok(a.register())
            a.subscribe()
        job = agents[0].list_jobs("l4").jobs[0]
        assert job.restarts == 1 and job.maxRestarts == 1
        # the round goes on: the same changeStrategy (not dump for a spent budget), the statuses close it
        for a in agents:
            a.expect("changeStrategy", "job-rescheduling")
        for a in agents:
            ok(a.status("job-rescheduling"))
        job = agents[0].list_jobs("l4").jobs[0]
        assert (job.state, job.restarts) == ("RUNNING", 1)
        assert job.rounds[0].strategiesTried == ["job-rescheduling"]
        assert job.rounds[0].outcome == "recovered"
        for a in agents:
            a.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
