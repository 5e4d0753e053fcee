"""The tests of tests/e2e/controller/test_persistence.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: State survives the controller: a graceful restart, a
SIGKILL, and the store's own tables.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from taskd.controller.machine.state_machine import (
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
from taskd.controller.storage.store import Store, default_state_path


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
    added = {"rejoining", "fences", "standbys", "min_nodes", "absent", "resume_watch", "last_signal"}
    assert m.snapshot().keys() - json.loads(OLD_SNAPSHOT).keys() == added
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
