"""Stored rows checked on load (issue 31, F7-F9): the row rules, the write-ahead log check, the schema version."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from taskd.controller.clock import identity
from taskd.controller.machine.events import Outcome
from taskd.controller.machine.model import MachineConfig
from taskd.controller.machine.state_machine import JobInit, JobMachine
from taskd.controller.storage.snapshot import snapshot
from taskd.controller.storage.store import STATE_VERSION, Store
from taskd.controller.storage.stored_rows import agent_problem, snapshot_problem
from taskd.controller.storage.wal_check import check_wal, wal_refusal


def a_snapshot(job_id: str = "j") -> dict:
    m = JobMachine(job_id, MachineConfig(), 100.0, JobInit(node_count=2, ranks_per_node=2, max_restarts=3))
    return json.loads(json.dumps(snapshot(m, identity)))


def test_a_snapshot_taskd_writes_passes() -> None:
    assert snapshot_problem(a_snapshot(), "j") == ""
    m = JobMachine("r", MachineConfig(), 100.0, JobInit(node_count=2, ranks_per_node=2, max_restarts=3))
    m.state = m.open_round({1: "1"}, 101.0, Outcome())  # a round open, its stopTrain the last signal
    snap = json.loads(json.dumps(snapshot(m, identity)))
    assert snap["round"] and snap["last_signal"] and snapshot_problem(snap, "r") == ""


@pytest.mark.parametrize(("field", "value", "said"), [
    ("restarts", "three", "field restarts is 'three', not a whole number"),
    ("restarts", 2**40, "field restarts is 1099511627776, not a whole number in [0, 2^31-1]"),
    ("state", "PAUSED", "field state is 'PAUSED', not one of RUNNING"),
    ("max_restarts", None, "field max_restarts is None"),
    ("recover_banned", 1, "field recover_banned is 1, not true or false"),
    ("fences", [[1, "h", 5]], "field fences is [[1, 'h', 5]], not a list whose entries are each a list of 8 entries"),
    ("rejoining", {"x": 1.0}, "key 'x' is not"),
    ("round", {"number": 1, "started_at": 1.0, "faults": {"0": 3}}, "an object whose field round.faults"),
    ("job_id", "other", "not the row's key 'j'"),
    ("last_signal", {"uuid": 5}, "an object whose field last_signal.uuid is 5, not a string"),
    ("round", {"number": 1, "started_at": 1.0, "faults": {}, "statuses": ["x"]}, "field round.statuses"),
])
def test_a_field_of_the_wrong_kind_is_named(field: str, value: object, said: str) -> None:
    snap = a_snapshot()
    snap[field] = value
    assert said in snapshot_problem(snap, "j")


def test_a_required_field_missing_and_a_non_object_are_named() -> None:
    snap = a_snapshot()
    del snap["node_count"]
    assert snapshot_problem(snap, "j") == "field node_count is missing"
    assert snapshot_problem([1], "j") == "its snapshot is [1], not a JSON object"
    old = {k: v for k, v in a_snapshot().items() if k in ("job_id", "state", "node_count", "max_restarts")}
    assert snapshot_problem(old, "j") == ""  # what an older taskd wrote: the rest take their defaults


def test_agent_rows() -> None:
    assert agent_problem((0, "agent", "h", 12, 2, 1.0, 2.0, 0, 0)) == ""
    assert agent_problem((0, None, None, None, None, None, None, 0, -9)) == ""
    assert agent_problem((0, "agent", "h", "twelve", 2, 1.0, 2.0, 0, 0)) == "column pid is 'twelve', not null or a " \
                                                                          "32-bit whole number"


def _store_with_jobs(path: Path, *jobs: str) -> None:
    store = Store(path)
    for job in jobs:
        m = JobMachine(job, MachineConfig(), 100.0, JobInit(node_count=1, ranks_per_node=1, max_restarts=3))
        store.commit(m, [], [], 100.0)
    store.close()


def test_a_bad_row_is_left_out_and_the_others_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.sqlite3"
    _store_with_jobs(path, "good", "bad", "garbled")
    with sqlite3.connect(path) as c:
        snap = json.loads(c.execute("SELECT snapshot FROM jobs WHERE job_id='bad'").fetchone()[0])
        snap["restarts"] = "three"
        c.execute("UPDATE jobs SET snapshot=? WHERE job_id='bad'", (json.dumps(snap),))
        c.execute("UPDATE jobs SET snapshot='{not json' WHERE job_id='garbled'")
    c.close()
    store = Store(path)
    assert [s["job_id"] for s, _ in store.load_jobs()] == ["good"]
    store.close()
    text = caplog.text
    assert f"state file {path}: job 'bad' not loaded: field restarts is 'three'" in text
    assert f"state file {path}: job 'garbled' not loaded: its snapshot is not JSON" in text


def _wal_with_commits(tmp_path: Path) -> tuple[Path, Path]:
    """A database and a copy of its write-ahead log holding three commits (none checkpointed)."""
    db = tmp_path / "w.sqlite3"
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.execute("CREATE TABLE t (x TEXT)")
    for i in range(3):
        c.execute("INSERT INTO t VALUES (?)", (f"row {i}" * 100,))
    saved = tmp_path / "saved-wal"
    shutil.copy(str(db) + "-wal", saved)
    c.close()
    return db, saved


def test_a_whole_log_and_a_torn_tail_pass(tmp_path: Path) -> None:
    db, saved = _wal_with_commits(tmp_path)
    assert check_wal(str(saved)) is None
    assert check_wal(str(tmp_path / "absent")) is None
    data = saved.read_bytes()
    torn = tmp_path / "torn"
    torn.write_bytes(data[:-100])  # the last frame cut short: a crash mid-write, nothing committed lost
    assert check_wal(str(torn)) is None


def test_a_flipped_byte_before_a_commit_is_refused(tmp_path: Path) -> None:
    db, saved = _wal_with_commits(tmp_path)
    data = bytearray(saved.read_bytes())
    data[32 + 24 + 100] ^= 0xFF  # inside the first frame's page
    (tmp_path / "w.sqlite3-wal").write_bytes(bytes(data))
    problem = check_wal(str(tmp_path / "w.sqlite3-wal"))
    assert problem is not None and problem.first_bad == 1 and problem.lost >= 3
    why = wal_refusal(str(db))
    assert f"{db}-wal" in why and "frame 1 fails its checksum" in why and "move" in why
    data[:4] = b"\0\0\0\0"
    (tmp_path / "w.sqlite3-wal").write_bytes(bytes(data))
    assert "not a SQLite write-ahead log header" in wal_refusal(str(db))


def test_the_version_is_written_and_a_newer_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    _store_with_jobs(path, "j")
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == STATE_VERSION
    c.execute(f"PRAGMA user_version = {STATE_VERSION + 1}")
    c.close()
    with pytest.raises(OSError, match=f"written by a newer taskd \\(state version {STATE_VERSION + 1}; this taskd "
                                      f"reads versions up to {STATE_VERSION}"):
        Store(path)
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA user_version").fetchone()[0] == STATE_VERSION + 1  # left as it was
    c.close()
