"""The job's snapshot memory on a node bounds the copies its agent receives as a buddy too (issue 33, item 2): the
launcher keeps them a share of the cap (`SnapshotArea.wards`), the buddy's `PeerService` refuses a push past it,
and the pushing side stops pushing to that buddy. Before, a buddy kept two copies of each of its peer node's ranks
beyond its own ranks' bound, counted by nothing. PeerService's methods are called as gRPC calls them, in this
thread; the push crosses no socket (`push_segments` is replaced at its boundary by a call of the real service)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taskd.agent.snapshots import copies as sc
from taskd.agent.snapshots import replication
from taskd.agent.snapshots.peer import FULL, PeerService, _chunks
from taskd.agent.snapshots.replication import Replication
from taskd.launcher.snapshots import SnapshotArea
from taskd.proto import recover_pb2, taskd_pb2
from taskd.worker.snapshot import Snapshots
from taskd.worker.snapshot_files import held, segment_name

JOB, KEY, NODE = "job-1", "k3y", 1
RANKS = (2, 3)


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {KEY}"),)

    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def _node(tmp: Path, monkeypatch: pytest.MonkeyPatch, steps: range) -> Path:
    """Node 1's ranks 2 and 3, each having published ``steps`` (kept, all of them)."""
    own = tmp / "node1"
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank in RANKS:
        monkeypatch.setenv("RANK", str(rank))
        snaps = Snapshots(keep=len(steps), scope="rank", directory=str(own), background=False)
        for step in steps:
            snaps.save({"w": np.full(40_000, float(step + 100 * rank))}, step)
        snaps.close()
    return own


def _bytes_under(root: Path) -> int:
    """What the files under ``root`` take, each once (the copies being received included)."""
    sizes = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


def _push(service: PeerService, own: Path, step: int, peak: list[int]) -> int:
    """Push ``step`` of both ranks, recording in ``peak`` the most the buddy's copies took while it was received."""
    def stream() -> Iterator[taskd_pb2.SnapshotChunk]:
        for rank in RANKS:
            for chunk in _chunks(JOB, NODE, rank, step, open(own / f"rank{rank}" / segment_name(step), "rb")):
                yield chunk
                peak[0] = max(peak[0], _bytes_under(Path(service.directory) / "peer"))
    return service.Push(stream(), _Context()).code  # type: ignore[arg-type]


def test_a_buddys_copies_stay_within_their_share_and_a_push_past_it_is_refused_its_copy_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The share holds the two kept copies of each rank and one being received; a state grown past it (here: a share
    too small for the third) is refused whole, nothing of it kept, and the ward's older copy goes too, so that a
    restore of that node falls back as when no copy exists instead of taking a copy its peers no longer match."""
    own = _node(tmp_path, monkeypatch, range(1, 5))
    segment = os.path.getsize(own / "rank2" / segment_name(1))  # header and body: what a push sends of it
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY, cap=3 * len(RANKS) * segment)
    peak = [0]
    assert [_push(buddy, own, step, peak) for step in (1, 2, 3, 4)] == [0, 0, 0, 0]
    assert peak[0] <= buddy.cap  # two kept per rank and the one being received: within the share, at every chunk
    assert held(str(tmp_path / "buddy" / "peer" / "node1")) == {2: {3, 4}, 3: {3, 4}}

    tight = PeerService(str(tmp_path / "tight"), lambda: JOB, lambda: KEY, cap=2 * len(RANKS) * segment + 1)
    peak = [0]
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        codes = [_push(tight, own, step, peak) for step in (1, 2, 3)]
    assert codes == [0, 0, FULL]  # the third copy of a rank would pass the share
    assert peak[0] <= tight.cap
    assert tight.wards == {} and tight.ward == (-1, -1)  # the controller hears it holds no copy of node 1
    assert not (tmp_path / "tight" / "peer" / "node1").exists()  # nothing half-received left, the old copy gone
    assert tight._receiving == 0
    assert "above their share of the job's snapshot memory" in caplog.text and "node 1's copy is dropped" in caplog.text
    fetch = tight.Fetch(taskd_pb2.FetchRequest(jobId=JOB, nodeRank=NODE), _Context())  # type: ignore[arg-type]
    assert list(fetch) == []  # a replacement finds no copy: its ranks fall back (restore_node says so)


class _Link:
    client = None

    def __init__(self) -> None:
        self.said: list[dict[str, Any]] = []

    def report_snapshots(self, fields: dict[str, Any], timeout: float) -> tuple[taskd_pb2.SnapshotReply, str]:
        self.said.append(dict(fields))
        return taskd_pb2.SnapshotReply(status=recover_pb2.Status(code=0), buddyNodeRank=0, buddyAddress="10.0.0.9:1",
                                       key=KEY), "10.0.0.1:2"


def test_a_push_walks_the_copies_held_once_not_once_a_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap's check counts what the published copies hold by walking them (an lstat a file); a push of 100 MB
    sends ~100 chunks, and each used to walk them again under the lock. Now once after each change."""
    own = _node(tmp_path, monkeypatch, range(1, 3))
    walks = []
    real = sc.held_bytes
    monkeypatch.setattr(sc, "held_bytes", lambda root: walks.append(root) or real(root))
    monkeypatch.setattr(sc, "CHUNK", 4096)  # many chunks a segment
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY, cap=1 << 30)
    chunks = [c for rank in RANKS
              for c in _chunks(JOB, NODE, rank, 1, open(own / f"rank{rank}" / segment_name(1), "rb"))]
    assert len(chunks) > 4
    assert buddy.Push(iter(chunks), _Context()).code == 0  # type: ignore[arg-type]
    assert len(walks) == 1, "one walk for the whole push"
    assert _push(buddy, own, 2, [0]) == 0
    assert len(walks) == 2, "the publish changed what is held: walked again once"
    assert buddy._held_bytes() == _bytes_under(Path(buddy.directory) / "peer") and len(walks) == 3


def test_a_refused_push_stops_pushes_to_that_buddy_until_it_is_tried_again_the_ranks_keeping_their_snapshots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The pushing side says why, pushes to that buddy no more for `REFUSED_RETRY` s (not the whole state again every
    tick), and reports a copy that is not there (replicatedStep -1, a growing lag); its ranks' own snapshots are
    untouched. Once that time has passed it tries again, quietly while refused, and says so when the buddy takes
    the copy (its space freed)."""
    own = tmp_path / "own"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        snaps = Snapshots(directory=str(own), background=False)
        snaps.save({"w": np.zeros(40_000)}, 1)
        snaps.close()
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY, cap=100_000)  # less than one segment
    pushes = []

    def push(_address: str, key: str, job_id: str, node: int, plan: dict[int, int], files: list, _t: float
             ) -> recover_pb2.Status:
        pushes.append(dict(plan))
        chunks = (c for rank, fh in files for c in _chunks(JOB, node, rank, plan[rank], fh))
        return buddy.Push(chunks, _Context())  # type: ignore[arg-type]
    monkeypatch.setattr(replication, "push_segments", push)
    monkeypatch.setattr(replication.Replication, "_job_id", lambda self: JOB)
    link = _Link()
    rep = Replication(str(own), link)  # type: ignore[arg-type]
    rep._report()
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        rep.tick()
    assert pushes == [{0: 1, 1: 1}]
    assert "refused this node's snapshots" in caplog.text and "tried again every 30s" in caplog.text
    rep.tick()
    rep.tick()
    assert len(pushes) == 1  # off for that pair
    rep._report()
    assert link.said[-1]["replicatedStep"] == -1 and link.said[-1]["lagSeconds"] >= 0.0
    assert held(str(own)) == {0: {1}, 1: {1}}
    assert not os.path.exists(tmp_path / "buddy" / "peer" / "node-1")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="taskd.agent"):
        rep._refused_at -= replication.REFUSED_RETRY
        rep.tick()  # still full: refused again, not said again at WARNING
        assert len(pushes) == 2 and rep.refused_by == rep.buddy
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "refused" in r.getMessage()]
        rep.tick()
        assert len(pushes) == 2
        buddy.cap = 0  # the space freed
        rep._refused_at -= replication.REFUSED_RETRY
        rep.tick()
    assert len(pushes) == 3 and rep.refused_by == (-1, "") and rep.replicated == 1
    assert "agent takes this node's snapshots again (steps {0: 1, 1: 1})" in caplog.text


@pytest.mark.parametrize("persist", [False, True])
def test_on_several_nodes_the_cap_keeps_the_wards_share_and_the_ranks_share_the_rest(
        tmp_path: Path, persist: bool) -> None:
    """A node's total for the job: its ranks' own segments (keep + 1 + pins each) and its peer node's copies (two
    kept and one received per rank), for a peer like itself, within the cap. Before, the ranks shared all of it."""
    from taskd.launcher.snapshots import Persistence
    nproc, cap = 2, 70 << 20
    for_persist = Persistence(str(tmp_path / "persisted"), 1, 1) if persist else None
    area = SnapshotArea("job", nproc, {}, root=str(tmp_path), memory=str(cap), persist=for_persist, nodes=2)
    try:
        segment = area.share // (2 + 1 + area.pins)  # the largest segment a rank with the default keep holds
        assert nproc * (2 + 1 + area.pins) * segment + nproc * (sc.KEEP + 1) * segment <= cap
        assert area.wards >= nproc * (sc.KEEP + 1) * segment and area.share * nproc + area.wards <= cap
    finally:
        area.close()
    alone = SnapshotArea("job1", nproc, {}, root=str(tmp_path), memory=str(cap), nodes=1)
    try:
        assert (alone.wards, alone.share) == (0, cap // nproc)  # one node: no buddy copies to leave room for
    finally:
        alone.close()
