"""The snapshots' memory bound with the agent's pins: a segment the push to the buddy or the persister holds by a
hard link is never written again, so the rank's next save takes a fresh one; the cap counts that headroom, and the
node's area tells each rank how many such pins it must leave room for (no process, no socket)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from taskd.framework.agent.ms_mgr.msrun_plugin import local_workers, msrun_area
from taskd.launcher.snapshots import Persistence, SnapshotArea
from taskd.worker import Snapshots
from taskd.worker.env import Var
from taskd.worker.snapshot_files import segment_name

SEGMENT = 1 << 16  # an 8 KB state takes one 64 KiB segment


@pytest.fixture(autouse=True)
def _ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (Var.RANK, Var.WORLD_SIZE, Var.GROUP_WORLD_SIZE, Var.TASKD_SNAPSHOT_DIR, Var.TASKD_SNAPSHOT_BYTES,
                Var.TASKD_SNAPSHOT_PINS, Var.TASKD_SNAPSHOT_FAULT, Var.TASKD_SNAPSHOT_PERSIST_DIR):
        monkeypatch.delenv(var, raising=False)


def held(directory) -> int:
    """Bytes the directory's files hold, each inode once (a pin is a second name of a segment)."""
    seen = {}
    for folder, _dirs, names in os.walk(directory):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            seen[st.st_ino] = st.st_blocks * 512
    return sum(seen.values())


def run_with_a_pin(directory, cap: int) -> list[bool]:
    """Steps 1-5 saved by a rank told of one pin (TASKD_SNAPSHOT_PINS), the agent linking step 1's segment before
    step 3's save frees it and holding it to the end (a slow push); the bytes held never exceed ``cap``."""
    snaps = Snapshots(keep=2, directory=str(directory), cap=cap, background=False)
    pins = os.path.join(str(directory), ".persist")
    saved = []
    for step in range(1, 6):
        if step == 3 and snaps.off is None:  # (off: it holds nothing to pin)
            os.makedirs(pins)
            os.link(os.path.join(str(directory), "rank0", segment_name(1)), os.path.join(pins, "rank0-s1.snap"))
        saved.append(snaps.save({"w": np.full(1000, float(step))}, step))
        assert held(directory) <= cap, f"step {step}: {held(directory)} bytes held, above the cap of {cap}"
    return saved


def test_a_pinned_segment_is_counted_in_the_cap(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv(Var.TASKD_SNAPSHOT_PINS, "1")
    assert run_with_a_pin(tmp_path / "fits", cap=4 * SEGMENT) == [True] * 5  # 2 kept + 1 written + 1 pinned
    assert held(tmp_path / "fits") == 4 * SEGMENT  # the pin's headroom is used, and no more
    # before, 3 segments passed the check, and the pin took a fourth beyond the cap
    assert run_with_a_pin(tmp_path / "short", cap=3 * SEGMENT) == [False] * 5
    assert "2 kept plus one being written plus 1 the agent may still be copying (to the buddy node, to disk) need " \
           "0.3 MB, above this rank's share" in caplog.text


def test_pins_come_from_the_agent_and_are_checked(tmp_path, monkeypatch) -> None:
    assert Snapshots(directory=str(tmp_path)).pins == 0  # one node, nothing persisted: no copier pins a segment
    monkeypatch.setenv(Var.TASKD_SNAPSHOT_PINS, "2")
    assert Snapshots(directory=str(tmp_path)).pins == 2
    with pytest.raises(ValueError, match="pins must be an integer >= 0, got -1"):
        Snapshots(directory=str(tmp_path), pins=-1)


def test_the_area_tells_each_rank_the_pins_of_the_agents_copiers(tmp_path) -> None:
    (tmp_path / "shm").mkdir()
    cases = [(1, None, "0"), (2, None, "1"), (1, Persistence(str(tmp_path / "disk"), 10, 2), "1"),
             (3, Persistence(str(tmp_path / "disk"), 10, 2), "2")]
    for nodes, persist, pins in cases:
        area = SnapshotArea("job", 2, {Var.TASKD_SNAPSHOT_MEMORY: "4M"}, root=str(tmp_path / "shm"), persist=persist,
                            nodes=nodes)
        try:
            assert area.env()[Var.TASKD_SNAPSHOT_PINS] == pins, (nodes, persist)
        finally:
            area.close()
    assert os.listdir(tmp_path / "shm") == []


def test_an_msrun_node_keeps_no_share_for_a_buddy_it_never_has(tmp_path) -> None:
    # msrun's agent replicates nothing: a two-node msrun job's ranks get the whole cap, the persister's pin aside
    (tmp_path / "shm").mkdir()
    argv = ["msrun", "--worker_num=4", "--local_worker_num", "2", "t.py"]
    for persisted, pins in (({}, "0"), ({Var.TASKD_SNAPSHOT_PERSIST_DIR: str(tmp_path / "disk")}, "1")):
        area = msrun_area("job", argv, {Var.TASKD_SNAPSHOT_MEMORY: "4M", **persisted}, root=str(tmp_path / "shm"))
        try:
            assert (area.env()[Var.TASKD_SNAPSHOT_PINS], area.wards, area.share) == (pins, 0, (4 << 20) // 2)
        finally:
            area.close()


def test_msrun_ranks_per_node_come_from_its_worker_counts() -> None:
    assert local_workers(["msrun", "--worker_num", "4", "t.py"]) == 4
