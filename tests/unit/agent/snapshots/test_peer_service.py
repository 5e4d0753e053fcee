"""A buddy's `PeerService` (agent/snapshots/replication.py): a push never changes what a fetch in flight sends, and a
push lands whole or not at all. Its methods are called as gRPC calls them, in this thread (no socket here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from taskd.agent.snapshots import copies as sc
from taskd.agent.snapshots.peer import PeerService, _chunks
from taskd.proto import taskd_pb2
from taskd.worker.snapshot import Snapshots
from taskd.worker.snapshot_files import held, segment_name

JOB, KEY, NODE = "job-1", "k3y", 1


class _Context:
    """What PeerService asks of gRPC's context: the caller's metadata, and abort."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {KEY}"),)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def _node(tmp: Path, monkeypatch: pytest.MonkeyPatch, steps: range) -> Path:
    """Node 1's ranks 2 and 3, each having published ``steps`` (kept, all of them)."""
    own = tmp / "node1"
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank in (2, 3):
        monkeypatch.setenv("RANK", str(rank))
        snaps = Snapshots(keep=len(steps), scope="rank", directory=str(own), background=False)
        for step in steps:
            snaps.save({"w": np.full(40_000, float(step + 100 * rank))}, step)
        snaps.close()
    return own


def _push(service: PeerService, own: Path, step: int, torn: int | None = None, node: int = NODE) -> int:
    def stream() -> Iterator[taskd_pb2.SnapshotChunk]:
        for rank in (2, 3):
            for chunk in _chunks(JOB, node, rank, step, open(own / f"rank{rank}" / segment_name(step), "rb")):
                if rank == torn and chunk.last:  # the rank reused the segment while it was read
                    chunk = taskd_pb2.SnapshotChunk(jobId=JOB, nodeRank=node, rank=rank, step=step, last=True,
                                                    data=chunk.data[:-1] + bytes([chunk.data[-1] ^ 0xFF]))
                yield chunk
    return service.Push(stream(), _Context()).code  # type: ignore[arg-type]


def _receive(chunks: Iterator[taskd_pb2.SnapshotChunk], into: Path) -> dict[int, set[int]]:
    """What a replacement's agent makes of a fetch (fetch_segments' loop): every segment checked (CRC) as it lands."""
    incoming = None
    for chunk in chunks:
        incoming = incoming or sc.Incoming(str(into), chunk.rank, chunk.step)
        incoming.write(chunk.data)
        if chunk.last:
            incoming.finish(keep=None)
            incoming = None
    return held(str(into))


def test_a_fetch_sends_the_copy_as_it_was_when_it_began_whatever_a_push_does_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore reads the buddy's copy while the node (declared lost, yet still running) goes on pushing: the
    push's renames and prunes once broke the fetch half-way (a segment listed, then pruned before it was opened)
    or mixed steps of two moments (one rank's copy listed before the push, the next rank's after it)."""
    own = _node(tmp_path, monkeypatch, range(1, 7))
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY)
    assert [_push(buddy, own, step) for step in (3, 4)] == [0, 0]
    fetch = buddy.Fetch(taskd_pb2.FetchRequest(jobId=JOB, nodeRank=NODE), _Context())  # type: ignore[arg-type]
    first = next(fetch)  # the fetch has begun: rank 2's step 3 is on its way
    assert [_push(buddy, own, step) for step in (5, 6)] == [0, 0]  # steps 3 and 4 pruned on the buddy
    assert held(str(tmp_path / "buddy" / "peer" / "node1")) == {2: {5, 6}, 3: {5, 6}}
    got = _receive(iter([first, *fetch]), tmp_path / "replacement")
    assert got == {2: {3, 4}, 3: {3, 4}}  # the moment the fetch began, whole
    assert os.listdir(tmp_path / "buddy" / "peer") == ["node1"]  # its pins gone with it


def test_a_push_lands_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 3's segment torn in two pushes in a row: rank 2's copies of those steps once landed alone and pruned
    the steps both ranks' copies had, leaving the buddy no step of the node's in common."""
    own = _node(tmp_path, monkeypatch, range(1, 5))
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY)
    assert [_push(buddy, own, step) for step in (1, 2)] == [0, 0]
    assert [_push(buddy, own, step, torn=3) for step in (3, 4)] == [409, 409]
    copy = tmp_path / "buddy" / "peer" / "node1"
    assert held(str(copy)) == {2: {1, 2}, 3: {1, 2}}
    assert buddy.ward == (NODE, 2)
    assert sorted(name for rank in (2, 3) for name in os.listdir(copy / f"rank{rank}")) == \
        sorted([segment_name(1), segment_name(2)] * 2)  # nothing half-received left behind


def test_a_lost_wards_copy_outlives_the_first_push_of_a_new_ward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """Three nodes, node 1 lost: node 2 held node 1's copy, and the ring, rechosen, makes node 2 node 0's buddy.
    Node 0's first push once removed node 1's copy, seconds before node 1's replacement came to fetch it."""
    own = _node(tmp_path, monkeypatch, range(1, 3))
    buddy = PeerService(str(tmp_path / "buddy"), lambda: JOB, lambda: KEY)
    assert _push(buddy, own, 2) == 0  # node 1's copy
    assert _push(buddy, own, 1, node=0) == 0  # node 0's, a new ward (the same bytes serve: where they land counts)
    assert buddy.wards == {1: 2, 0: 1}
    fetch = buddy.Fetch(taskd_pb2.FetchRequest(jobId=JOB, nodeRank=1), _Context())  # type: ignore[arg-type]
    assert _receive(fetch, tmp_path / "replacement") == {2: {2}, 3: {2}}
    buddy.drop([1])  # the controller's word, once node 1 is copied elsewhere
    assert buddy.wards == {0: 1} and not (tmp_path / "buddy" / "peer" / "node1").exists()
