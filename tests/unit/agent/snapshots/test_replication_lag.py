"""The replication's lag (agent/snapshots/replication.py) grows while the buddy's copy falls behind, and the push
thread looks at the ranks' folders once a tick. The controller link is a stand-in recording what is reported, and
the push to the buddy is replaced at its boundary (`push_segments`): no socket in this tier."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from taskd.agent.snapshots import copies as sc
from taskd.agent.snapshots import peer, replication
from taskd.agent.snapshots.replication import CopyLag, Replication
from taskd.proto import recover_pb2, taskd_pb2
from taskd.worker.snapshot import Snapshots
from taskd.worker.snapshot_account import take_fetched
from taskd.worker.snapshot_files import steps_in


class _Link:
    """What Replication asks of its controller link: it reports, and is told its buddy and the key."""

    client = None

    def __init__(self) -> None:
        self.said: list[dict[str, Any]] = []

    def report_snapshots(self, fields: dict[str, Any], timeout: float) -> tuple[taskd_pb2.SnapshotReply, str]:
        self.said.append(dict(fields))
        return taskd_pb2.SnapshotReply(status=recover_pb2.Status(code=0), buddyNodeRank=0, buddyAddress="10.0.0.9:1",
                                       key="k3y"), "10.0.0.1:2"


class _Unanswered(grpc.RpcError):
    pass


def _ranks(directory: Path, monkeypatch: pytest.MonkeyPatch, world: int = 2) -> list[Snapshots]:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    out = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        out.append(Snapshots(directory=str(directory), background=False))
    return out


def test_the_lag_grows_while_the_buddy_lacks_the_newest_step_and_stops_once_it_holds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushes failing (a buddy that stopped answering): the lag once stayed at the last copy's figure (0 here) while
    the copy fell behind; it must say how long the copy has been behind."""
    def unanswered(*_args: object) -> recover_pb2.Status:
        for _rank, fh in _args[5]:  # type: ignore[union-attr]
            fh.close()
        raise _Unanswered()
    monkeypatch.setattr(replication, "push_segments", unanswered)
    link = _Link()
    rep = Replication(str(tmp_path), link)  # type: ignore[arg-type]
    rep._report()  # learns its buddy and the key
    for snaps in _ranks(tmp_path, monkeypatch):
        snaps.save({"w": np.zeros(100)}, 1)
        snaps.close()
    rep.tick()
    rep._report()
    time.sleep(0.3)
    rep.tick()
    rep._report()
    first, second = link.said[-2], link.said[-1]
    assert (first["newestStep"], first["replicatedStep"]) == (1, -1)
    assert second["lagSeconds"] >= first["lagSeconds"] + 0.25  # 0.3 s later, still lacking step 1

    monkeypatch.setattr(replication, "push_segments", lambda *a: [fh.close() for _r, fh in a[5]] and
                        recover_pb2.Status(code=0))
    rep.tick()  # the buddy answers again: it holds step 1, copied (the stall included) after its publish
    rep._report()
    time.sleep(0.1)
    rep.tick()  # nothing new to push: the lag stays the acknowledged copy's
    rep._report()
    caught_up, later = link.said[-2], link.said[-1]
    assert caught_up["replicatedStep"] == 1
    assert caught_up["lagSeconds"] >= second["lagSeconds"]
    assert later["lagSeconds"] == caught_up["lagSeconds"]


def test_a_tick_and_its_report_look_at_each_rank_folder_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report once listed the folders again for its newest step, and the push a third time for their paths."""
    monkeypatch.setattr(replication, "push_segments", lambda *a: [fh.close() for _r, fh in a[5]] and
                        recover_pb2.Status(code=0))
    link = _Link()
    rep = Replication(str(tmp_path), link)  # type: ignore[arg-type]
    rep._report()
    for snaps in _ranks(tmp_path, monkeypatch):
        snaps.save({"w": np.zeros(100)}, 1)
        snaps.close()
    looked: list[str] = []
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": looked.append(str(path)) or listdir(path))
    rep.tick()
    rep._report()
    assert sorted(looked) == sorted([str(tmp_path), str(tmp_path / "rank0"), str(tmp_path / "rank1")])
    assert link.said[-1]["replicatedStep"] == 1
    assert link.said[-1]["rankNewest"] == {0: 1, 1: 1}  # each rank's own newest (scope "rank": they differ)


def test_a_replacement_that_fetches_nothing_still_tells_its_ranks_how_far_they_had_got(tmp_path: Path) -> None:
    replication._fallback("no buddy copy of node 1's snapshots survives", str(tmp_path), 1, [2, 3], {2: 40, 3: 35})
    assert [take_fetched(str(tmp_path), rank).newest for rank in (2, 3)] == [40, 35]  # type: ignore[union-attr]


def test_copy_lag() -> None:
    lag = CopyLag()
    assert lag.seconds(100.0) == 0.0
    lag.lacks(100.0)
    lag.lacks(101.0)  # still behind since the first step it lacked
    assert lag.seconds(104.0) == 4.0
    lag.acknowledged(100.0, 104.5)
    assert lag.seconds(200.0) == 4.5
    lag.lacks(199.0)
    assert lag.seconds(199.5) == 4.5  # behind for less than the last copy took: that figure stands
    assert lag.seconds(210.0) == 11.0


def test_status_says_how_long_a_copy_has_been_behind() -> None:
    from taskd.controller.status_view import _snapshots
    job = taskd_pb2.JobRecord(snapshots=[
        taskd_pb2.SnapshotRecord(nodeRank=0, buddyNodeRank=1, newestStep=9, replicatedStep=9, lagSeconds=0.02),
        taskd_pb2.SnapshotRecord(nodeRank=1, buddyNodeRank=0, newestStep=60, replicatedStep=9, lagSeconds=12.5),
        taskd_pb2.SnapshotRecord(nodeRank=2, buddyNodeRank=0, newestStep=3, replicatedStep=-1, lagSeconds=4.0)])
    lines = "\n".join(_snapshots(job))
    assert "node 0: newest step 9; node 1 holds step 9 (copied 0.020s after its publish)" in lines
    assert "node 1: newest step 60; node 0 holds step 9 (12.500s behind)" in lines
    assert "node 2: newest step 3; node 0 holds none (4.000s behind)" in lines


def test_a_push_pins_what_it_reads_so_a_fast_rank_cannot_tear_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that reuses the segment being pushed (it saves faster than the push reads) once sent the buddy a torn
    copy (refused, retried, and again while the ranks outran it). The push links its segments while it reads them:
    the rank takes another segment, and the bytes sent are the step's."""
    [snaps] = _ranks(tmp_path, monkeypatch, world=1)
    for step in (1, 2):
        snaps.save({"w": np.full(50_000, float(step))}, step)
    received = tmp_path / "buddy"

    def push(_address: str, _key: str, job: str, node: int, plan: dict, files: list, _timeout: float
             ) -> recover_pb2.Status:
        for step in (3, 4, 5):  # the rank goes on meanwhile: step 5 takes the segment step 2 was freed from
            snaps.save({"w": np.full(50_000, float(step))}, step)
        for rank, fh in files:
            incoming = sc.Incoming(str(received), rank, plan[rank])
            for chunk in peer._chunks(job, node, rank, plan[rank], fh):
                incoming.write(chunk.data)
            incoming.finish()  # SnapshotError for a torn copy
        return recover_pb2.Status(code=0)
    monkeypatch.setattr(replication, "push_segments", push)
    link = _Link()
    rep = Replication(str(tmp_path), link)  # type: ignore[arg-type]
    rep._report()
    rep.tick()
    rep._report()
    assert link.said[-1]["replicatedStep"] == 2 and steps_in(str(received / "rank0")) == {2}
    assert not (tmp_path / ".replicate").exists()  # the pins go with the push
    snaps.close()
