"""Persisted snapshots in one process: the pin that keeps a copied segment's bytes, the step that is due, a copy
of a reused segment refused, and restore's fallback to the persisted copies (no process, no socket)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from taskd.launcher.snapshot_persist import Persister, _Pins
from taskd.worker import SnapshotError, Snapshots
from taskd.worker import snapshot_persist as sp
from taskd.worker.env import Var
from taskd.worker.snapshot_files import segment_name


@pytest.fixture(autouse=True)
def _ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (Var.RANK, Var.WORLD_SIZE, Var.GROUP_WORLD_SIZE, Var.TASKD_SNAPSHOT_DIR, Var.TASKD_SNAPSHOT_BYTES,
                Var.TASKD_SNAPSHOT_FAULT, Var.TASKD_SNAPSHOT_PERSIST_DIR, Var.RANK_ID, Var.RANK_SIZE):
        monkeypatch.delenv(var, raising=False)


def state(step: int) -> dict:
    return {"w": np.full(5000, float(step)), "step": step}


def test_a_pinned_segment_is_never_written_again_so_its_copy_holds_its_step(tmp_path) -> None:
    shm = str(tmp_path / "shm")
    snaps = Snapshots(directory=shm, background=False)
    for step in (1, 2):
        snaps.save(state(step), step)
    with _Pins(shm, 1) as pins:
        for step in (3, 4, 5):  # step 1's segment is freed, and would be reused without the pin
            snaps.save(state(step), step)
        tmp = sp.write_copy(pins[0], str(tmp_path / "disk" / "rank0"), 0, 1)
    sp.publish(tmp, 1)
    assert not os.listdir(os.path.join(shm, ".persist")), "the pins go once copied"
    fresh = Snapshots(directory=str(tmp_path / "empty"), background=False, persist_dir=str(tmp_path / "disk"))
    found = fresh.restore()
    assert found is not None and found[1] == 1 and found[0]["w"].tobytes() == state(1)["w"].tobytes()
    assert fresh.restored_from == "persisted"


def test_a_copy_of_a_segment_changed_while_read_is_refused_and_leaves_nothing(tmp_path) -> None:
    shm = str(tmp_path / "shm")
    snaps = Snapshots(directory=shm, background=False)
    snaps.save(state(1), 1)
    path = os.path.join(shm, "rank0", segment_name(1))
    with open(path, "r+b") as fh:  # what a rank reusing it would do: new bytes under the old header
        fh.seek(200)
        fh.write(b"\xff" * 8)
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        sp.write_copy(path, str(tmp_path / "disk" / "rank0"), 0, 1)
    assert os.listdir(tmp_path / "disk" / "rank0") == []


def test_the_step_due_is_the_multiple_else_the_first_seen_past_it(tmp_path) -> None:
    persister = Persister(str(tmp_path / "shm"), str(tmp_path / "disk"), 1, every=10, keep=2)
    try:
        assert persister.due({8, 9}) is None
        assert persister.due({10, 11}) == 10
        persister.last = 10
        assert persister.due({19}) is None and persister.due({23, 24}) == 24
        assert persister.due({3, 4}) is None and persister.last == 4  # the ranks went back: counted from there
    finally:
        persister.close()


def test_a_persist_directory_that_cannot_be_made_is_refused_and_leaves_nothing(tmp_path) -> None:
    from taskd.launcher.snapshots import Persistence, SnapshotArea

    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    shm = tmp_path / "shm"
    shm.mkdir()
    with pytest.raises(ValueError, match=f"--snapshot-persist-dir {blocked / 'ckpt'}: "):
        SnapshotArea("job", 1, {}, root=str(shm), persist=Persistence(str(blocked / "ckpt"), 10, 3))
    assert os.listdir(shm) == [], "the job's snapshot directory goes with the refusal"


def test_across_nodes_a_copy_failing_its_check_moves_every_rank_to_the_older_step(tmp_path, monkeypatch) -> None:
    """Two ranks of two nodes (threads, ``agree`` an intersection at a barrier, as the collective is), what is left
    of a job started with 4 ranks: rank 1's copy of step 2 is whole but one byte off. Both take step 1, and say why
    (before, rank 0 took 2 and rank 1 nothing); the vote counts the ranks there now, not the 4 of the start."""
    import threading

    disk = tmp_path / "disk"
    for rank in (0, 1):
        monkeypatch.setenv(Var.RANK, str(rank))
        monkeypatch.setenv(Var.WORLD_SIZE, "4")  # the job started with 4 ranks; 2 remain after a scale-in
        shm = tmp_path / f"shm{rank}"
        snaps = Snapshots(directory=str(shm), keep=3, background=False)
        for step in (1, 2):
            snaps.save(state(step), step)
            sp.publish(sp.write_copy(str(shm / f"rank{rank}" / segment_name(step)), str(disk / f"rank{rank}"),
                                     rank, step), step)
    with open(disk / "rank1" / segment_name(2), "r+b") as fh:
        fh.seek(300)
        fh.write(b"\x01")
    barrier, sets, got = threading.Barrier(2, timeout=30), [set(), set()], [None, None]

    def run(rank: int) -> None:
        def agree(held: set[int]) -> set[int]:
            sets[rank] = held
            barrier.wait()
            common = sets[0] & sets[1]
            barrier.wait()
            return common
        got[rank] = sp.cut(str(disk), 4, agree, rank)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [g.step for g in got] == [1, 1], got
    assert got[0].words() == "step 2: rank 1's copy fails its check (its line says why)"  # was: another rank's
    assert got[1].words().startswith("step 2: rank 1's copy fails its check (") and \
        "checksum mismatch" in got[1].words() and (disk / "rank1" / f"{segment_name(2)}.corrupt").exists()


def test_msruns_persistence_comes_from_the_variables_through_the_settings_table() -> None:
    """msrun's command line is not taskd's: its plugin reads TASKD_SNAPSHOT_PERSIST_* (names, defaults, bounds from
    taskd/settings.py); a bad value is refused naming its variable."""
    from taskd.launcher.snapshots import Persistence

    assert Persistence.from_env({}) is None
    assert Persistence.from_env({"TASKD_SNAPSHOT_PERSIST_DIR": "/ckpt"}) == Persistence("/ckpt", 100, 3)
    assert Persistence.from_env({"TASKD_SNAPSHOT_PERSIST_DIR": "/ckpt", "TASKD_SNAPSHOT_PERSIST_EVERY": "4",
                                 "TASKD_SNAPSHOT_PERSIST_KEEP": "2"}) == Persistence("/ckpt", 4, 2)
    for var, raw in (("TASKD_SNAPSHOT_PERSIST_EVERY", "0"), ("TASKD_SNAPSHOT_PERSIST_KEEP", "two")):
        with pytest.raises(ValueError, match=f"{var}="):
            Persistence.from_env({"TASKD_SNAPSHOT_PERSIST_DIR": "/ckpt", var: raw})
