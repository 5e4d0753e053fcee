"""State survives the controller: a graceful restart, a SIGKILL, and the store's own tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scripted_agent import ScriptedAgent

from taskd.controller.server import ControllerConfig, ControllerServer, EmbeddedController
from taskd.controller.state_machine import (
    AgentConnected,
    AgentRegistered,
    FaultReported,
    JobInit,
    JobMachine,
    MachineConfig,
    Record,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.store import Store, default_state_path
from taskd.launcher.spec import free_port

REPO = Path(__file__).resolve().parents[1]
ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def config(path: Path, port: int = 0) -> ControllerConfig:
    return ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(path), keepalive_interval=0.3,
                            stop_timeout=60, strategy_timeout=60, recover_timeout=60, resume_timeout=60)


def recover_round(agents: list[ScriptedAgent], fault: dict[int, int]) -> None:
    ok(agents[0].fault(fault))
    for a in agents:
        a.expect("stopTrain")
    for a in agents:
        ok(a.stop_complete())
    for a in agents:
        a.expect("globalFault")
    for a in agents:
        ok(a.strategies(ALL))
    for a in agents:
        a.expect("changeStrategy", "recover")
    for a in agents:
        ok(a.status("recover"))


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


def test_store_tables_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    m = JobMachine("j", MachineConfig(), 1.0, JobInit(node_count=1))
    for t, ev in enumerate([AgentRegistered(host="h", pid=7), FaultReported(faults={0: "1"}, detail="died"),
                            StopComplete(), StrategiesReported(strategies=("recover", "exit")),
                            RecoverStatusReported(code=1, strategy="recover")], start=2):
        out = m.handle(ev, float(t))
        store.commit(m, out.records, out.agents_changed, float(t))
    store.commit(m, [Record("note", 1, {"x": 1})], [], 9.0)
    store.close()

    store = Store(path)
    ((snap, agents),) = store.load_jobs()
    assert snap["state"] == "FAILED" and agents[0].host == "h" and agents[0].pid == 7
    assert [(f["rank"], f["fault_type"], f["detail"]) for f in store.faults("j")] == [(0, "1", "died")]
    assert [(s["strategy"], s["outcome"]) for s in store.strategies("j")] == [("recover", "failed"), ("exit", "failed")]
    (rnd,) = store.rounds("j")
    assert rnd["tried"] == ["recover", "exit"] and rnd["outcome"] == "failed"
    assert rnd["duration"] == 3.0  # fault at t=3, failed status at t=6
    assert store.events("j")[-1]["kind"] == "note"
    assert len(store.events("j", limit=3)) == 3
    store.close()


def test_default_state_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_state_path() == tmp_path / "taskd" / "controller.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_path() == tmp_path / "home" / ".local" / "share" / "taskd" / "controller.sqlite3"


def test_unusable_state_file_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite3"
    junk.write_text("not a database")
    with pytest.raises(OSError, match="junk.sqlite3"):
        Store(junk)


def test_state_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """It names every job's hosts, pids and faults: 0600, whatever the umask, -wal and -shm too."""
    path = tmp_path / "new.sqlite3"
    old_umask = os.umask(0)  # the mode must not depend on a strict umask
    try:
        store = Store(path)
        m = JobMachine("j", MachineConfig(), 1.0, JobInit(node_count=1))
        out = m.handle(AgentRegistered(host="h", pid=7), 2.0)
        store.commit(m, out.records, out.agents_changed, 2.0)
        files = [p for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()]
        assert len(files) == 3, files  # WAL mode: the companions exist while the store is open
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}
        store.close()
    finally:
        os.umask(old_umask)


def test_state_file_left_readable_by_an_older_version_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    Store(path).close()
    path.chmod(0o644)
    Store(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


# A job caught mid-round (recover failed, job-rescheduling under way, a fault queued), as the state machine
# wrote it before it was split into modules: state files of that version must keep loading.
OLD_SNAPSHOT = (
    '{"created_at": 1.0, "deadline": 305.0, "info": "round 1: faults 5:1", "job_id": "old", "max_restarts": 5, '
    '"node_count": 2, "policy": ["recover", "job-rescheduling", "exit"], "queued": {"1": "1"}, "ranks_per_node": 4, '
    '"recover_banned": false, "recover_succeeded_at": null, "restarts": 2, "round": {"excluded": {}, '
    '"failed": ["recover"], "faults": {"5": "1"}, "number": 1, "started_at": 2.0, "strategy": "job-rescheduling", '
    '"tried": ["recover", "job-rescheduling"]}, "round_counter": 1, "signal_seq": 4, "state": "RECOVERING", '
    '"unsettled_recovers": 0, "updated_at": 6.0}'
)


def test_state_file_of_the_unsplit_state_machine_still_loads(tmp_path: Path) -> None:
    store = Store(tmp_path / "old.sqlite3")
    store.conn.execute("INSERT INTO jobs VALUES ('old', 'RECOVERING', ?, 1.0, 6.0)", (OLD_SNAPSHOT,))
    for n in (0, 1):
        store.conn.execute("INSERT INTO agents (job_id, node_rank, role, host, pid, ranks_per_node, registered_at, "
                           "last_seen) VALUES ('old', ?, 'agent', 'h', ?, 4, 1.0, 6.0)", (n, 100 + n))
    ((snap, agents),) = store.load_jobs()
    m, out = JobMachine.restore(snap, agents, MachineConfig(), 10.0)
    assert [r.kind for r in out.records] == ["state", "round_resuming"]
    assert m.state.value == "RESUMING" and m.restarts == 2 and m.max_restarts == 5 and m.ranks_per_node == 4
    assert m.agents.problems() == [] and sorted(m.agents) == [0, 1] and m.agents.subscribed_count == 0
    # the format written is the format read, plus the keys issue 17 added (read with a default when missing)
    assert m.snapshot().keys() - json.loads(OLD_SNAPSHOT).keys() == {"rejoining", "fences"}
    assert json.loads(OLD_SNAPSHOT).keys() <= m.snapshot().keys()
    for n in (0, 1):
        resumed = m.handle(AgentConnected(node_rank=n), 11.0)
    (stop,) = resumed.signals  # the round restarts with the queued fault merged in
    assert stop.signal_type == "stopTrain" and stop.faults == ((1, "1"), (5, "1")) and stop.nodes == (0, 1)
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n), 12.0)
    for n in (0, 1):
        decided = m.handle(StrategiesReported(node_rank=n, strategies=("recover", "job-rescheduling", "exit")), 13.0)
    (change,) = decided.signals
    assert change.strategy == "job-rescheduling"  # recover failed in this round before the restart: still excluded
    assert m.restarts == 2  # job-rescheduling was charged before the restart, and is not charged again (L4)
    store.close()


def test_sigkill_during_recovering_charges_the_restart_once(tmp_path: Path) -> None:
    """L4: the controller dies after choosing job-rescheduling (one restart spent); the restarted controller
    resumes the round from the state file, the same strategy is chosen again, and the budget shows one restart."""
    state = tmp_path / "ctl.sqlite3"
    proc, addr = start_subprocess(state)
    try:
        agents = [ScriptedAgent(addr, "l4", n, 2) for n in range(2)]
        for a in agents:
            a.join(max_restarts=1)  # the interrupted restart is the last one the job may spend
        ok(agents[0].fault({0: 2}))  # a network fault: job-rescheduling
        for a in agents:
            a.expect("stopTrain")
        for a in agents:
            ok(a.stop_complete())
        for a in agents:
            a.expect("globalFault")
        for a in agents:
            ok(a.strategies(ALL))
        for a in agents:
            a.expect("changeStrategy", "job-rescheduling")
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
        for a in agents:
            a.expect("stopTrain")  # the round restarts once every agent is back
        for a in agents:
            ok(a.stop_complete())
        for a in agents:
            a.expect("globalFault")
        for a in agents:
            ok(a.strategies(ALL))
        for a in agents:
            a.expect("changeStrategy", "job-rescheduling")  # paid for already: not dump for a spent budget
        for a in agents:
            ok(a.status("job-rescheduling"))
        job = agents[0].list_jobs("l4").jobs[0]
        assert (job.state, job.restarts) == ("RUNNING", 1)
        assert job.rounds[0].strategiesTried == ["job-rescheduling", "job-rescheduling"]
        assert job.rounds[0].outcome == "recovered"
        for a in agents:
            a.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
