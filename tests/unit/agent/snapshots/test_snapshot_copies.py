"""A received snapshot copy (agent/snapshots/copies.py) is published only when intact; older copies are pruned."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from taskd.agent.snapshots import copies as sc
from taskd.worker.snapshot import Snapshots
from taskd.worker.snapshot_files import steps_in
from taskd.worker.snapshot_segment import SnapshotError


def _segments(tmp: Path, steps: range) -> dict[int, bytes]:
    snaps = Snapshots(keep=len(steps), scope="rank", directory=str(tmp / "src"), background=False)
    out = {}
    for step in steps:
        snaps.save({"w": np.full(1000, float(step))}, step)
        out[step] = (tmp / "src" / f"rank{snaps.rank}" / sc.segment_name(step)).read_bytes()
    snaps.close()
    return out


def _receive(root: Path, step: int, data: bytes, keep: int | None = sc.KEEP) -> None:
    incoming = sc.Incoming(str(root), 0, step)
    incoming.write(data)
    incoming.finish(keep)


def test_copies_are_published_pruned_and_a_newer_step_of_an_ended_run_dropped(tmp_path: Path) -> None:
    data = _segments(tmp_path, range(1, 5))
    root = tmp_path / "peer"
    for step in (1, 2, 3, 4):
        _receive(root, step, data[step])
    assert steps_in(str(root / "rank0")) == {3, 4}  # the newest KEEP
    _receive(root, 2, data[2])  # the job restored step 2 and goes on: 3 and 4 belong to the run the fault ended
    assert steps_in(str(root / "rank0")) == {2}
    assert sc.to_push(str(root)) == {0: 2}


def test_a_torn_copy_is_never_published(tmp_path: Path) -> None:
    data = _segments(tmp_path, range(1, 2))[1]
    torn = bytearray(data)
    torn[sc.HEADER_SIZE + 4000] ^= 0xFF  # inside the body (the segment is padded past it)
    root = tmp_path / "peer"
    with pytest.raises(SnapshotError, match="checksum"):
        _receive(root, 1, bytes(torn))
    with pytest.raises(SnapshotError, match="not 2 of 0"):
        _receive(root, 2, data)  # step 1's segment under step 2's name
    assert os.listdir(root / "rank0") == []  # nothing published, nothing half-written left


def _rank(directory: Path, rank: int, monkeypatch: pytest.MonkeyPatch) -> Snapshots:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    return Snapshots(scope="rank", directory=str(directory), background=False)


def test_the_push_follows_each_ranks_newest_when_ranks_drifted_apart(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks that never exchange state (scope "rank") drift apart under load by more than the two steps each keeps:
    no step is common then, and a push of the newest common step stopped the buddy's copy where they last agreed
    (the copy at step 6 while the ranks trained past 500). Each rank's own newest is what goes next."""
    fast, slow = _rank(tmp_path, 2, monkeypatch), _rank(tmp_path, 3, monkeypatch)
    for step in range(1, 7):
        fast.save({"w": np.zeros(10)}, step)
        slow.save({"w": np.zeros(10)}, step)
    assert sc.to_push(str(tmp_path)) == {2: 6, 3: 6}  # in step: the newest common one, a consistent cut
    for step in range(7, 30):
        fast.save({"w": np.zeros(10)}, step)
    slow.save({"w": np.zeros(10)}, 7)
    assert not steps_in(str(tmp_path / "rank2")) & steps_in(str(tmp_path / "rank3"))  # no common step
    assert sc.to_push(str(tmp_path)) == {2: 29, 3: 7}
    fast.close()
    slow.close()
    (tmp_path / "rank4").mkdir()  # a rank that published nothing yet: nothing to push until it has
    assert sc.to_push(str(tmp_path)) == {}
