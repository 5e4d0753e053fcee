"""The buddy policy (controller/nodes/replicas.py): each live node's buddy is the next live node in ring order."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from taskd.controller.nodes.replicas import buddy_ring, on_report
from taskd.proto import taskd_pb2


@pytest.mark.parametrize(("live", "expected"), [
    ([], {}),
    ([0], {}),  # alone: no one to copy to
    ([0, 1], {0: 1, 1: 0}),
    ([0, 1, 2, 3], {0: 1, 1: 2, 2: 3, 3: 0}),
    ([0, 2, 3], {0: 2, 2: 3, 3: 0}),  # node 1 lost: node 0's buddy is rechosen, the others keep theirs
    ([3, 0, 2, 2], {0: 2, 2: 3, 3: 0}),  # order and repeats do not matter
])
def test_buddy_ring(live: list[int], expected: dict[int, int]) -> None:
    assert buddy_ring(live) == expected


@dataclass
class _Agent:
    host: str
    pid: int
    gone_since: float | None = None


@dataclass
class _Job:
    job_id: str = "j"
    agents: dict[int, _Agent] = field(default_factory=dict)
    replicas: object = None


def _report(node: int, pid: int, ward: int = -1, ward_step: int = -1) -> taskd_pb2.SnapshotReport:
    return taskd_pb2.SnapshotReport(jobId="j", nodeRank=node, host="h", pid=pid, address=f"10.0.0.{node}:1",
                                    newestStep=5, replicatedStep=4, wardNodeRank=ward, wardStep=ward_step)


def test_a_replacement_is_told_who_holds_its_nodes_copy_and_a_lost_node_is_no_ones_buddy() -> None:
    job = _Job(agents={0: _Agent("h", 10), 1: _Agent("h", 11)})
    on_report(job, _report(1, 11, ward=0, ward_step=4), 0.0, lambda j: f"cred-{j}")  # type: ignore[arg-type]
    reply = on_report(job, _report(0, 10, ward=1, ward_step=4), 0.0, None)  # type: ignore[arg-type]
    assert (reply.buddyNodeRank, reply.buddyAddress, reply.key) == (1, "10.0.0.1:1", "cred-j")
    job.agents[1] = _Agent("h", 11, gone_since=1.0)  # node 1's agent is gone
    reply = on_report(job, _report(0, 10, ward=1, ward_step=4), 1.0, None)  # type: ignore[arg-type]
    assert reply.buddyNodeRank == -1 and reply.buddyAddress == ""
    job.agents[1] = _Agent("h", 99)  # its replacement registered: node 0 holds its copy
    reply = on_report(job, _report(1, 99), 2.0, None)  # type: ignore[arg-type]
    assert (reply.holderNodeRank, reply.holderAddress, reply.holderStep, reply.buddyNodeRank) == (0, "10.0.0.0:1", 4, 0)
    assert on_report(job, _report(0, 10, ward=1, ward_step=4), 2.0, None).buddyNodeRank == 1  # type: ignore[arg-type]


def test_a_stale_report_makes_no_buddy() -> None:
    job = _Job(agents={0: _Agent("h", 10), 1: _Agent("h", 11)})
    on_report(job, _report(1, 11), 0.0, None)  # type: ignore[arg-type]
    assert on_report(job, _report(0, 10), 60.0, None).buddyNodeRank == -1  # type: ignore[arg-type]


def test_a_new_agent_for_a_node_is_told_how_far_its_lost_ranks_had_got() -> None:
    """Issue 33: a replacement's ranks restore from a buddy's copy that lags them; the node's previous agent last
    reported each rank's newest step (ranks of scope "rank" each their own), and the replacement learns them."""
    job = _Job(agents={0: _Agent("h", 10), 1: _Agent("h", 11)})
    lost = taskd_pb2.SnapshotReport(jobId="j", nodeRank=1, host="h", pid=11, address="10.0.0.1:1", newestStep=35,
                                    replicatedStep=33, wardNodeRank=0, wardStep=30, rankNewest={2: 40, 3: 35})
    assert dict(on_report(job, lost, 0.0, None).lostNewest) == {}  # type: ignore[arg-type]
    assert dict(on_report(job, lost, 1.0, None).lostNewest) == {}  # type: ignore[arg-type]  # the same agent
    job.agents[1] = _Agent("h", 99)  # its replacement registered
    reply = on_report(job, _report(1, 99), 2.0, None)  # type: ignore[arg-type]
    assert dict(reply.lostNewest) == {2: 40, 3: 35}
    assert dict(on_report(job, _report(1, 99), 3.0, None).lostNewest) == {2: 40, 3: 35}  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "said"), [
    ({"rankNewest": {-1: 4}}, "rankNewest needs ranks >= 0 and steps >= -1, got {-1: 4}"),
    ({"rankNewest": {2: -5}}, "rankNewest needs ranks >= 0 and steps >= -1, got {2: -5}"),
    ({"lagSeconds": float("nan")}, "lagSeconds must be finite and >= 0, got nan"),
    ({"rankNewest": {2: 4, 3: -1}}, ""),
])
def test_a_snapshot_report_is_checked(fields: dict, said: str) -> None:
    from taskd.controller.service.validation import check_snapshots
    req = taskd_pb2.SnapshotReport(jobId="j", nodeRank=1, host="h", pid=11, address="10.0.0.1:1", **fields)
    assert check_snapshots(req) == said


def _held(node: int, pid: int, wards: dict[int, int], replicated: int = 4) -> taskd_pb2.SnapshotReport:
    return taskd_pb2.SnapshotReport(jobId="j", nodeRank=node, host="h", pid=pid, address=f"10.0.0.{node}:1",
                                    newestStep=5, replicatedStep=replicated, wardNodeRank=-1, wardStep=-1,
                                    wards=wards)


def test_a_lost_nodes_copy_is_kept_until_its_node_is_copied_elsewhere() -> None:
    """Three nodes, node 1 lost: node 2 holds node 1's copy, and the rechosen ring sends it node 0's too. Node 1's
    replacement is told node 2 holds its copy; node 2 drops node 0's only once node 0 is copied to node 1 again."""
    job = _Job(agents={0: _Agent("h", 10), 1: _Agent("h", 11), 2: _Agent("h", 12)})
    job.agents[1] = _Agent("h", 11, gone_since=1.0)
    on_report(job, _held(0, 10, {2: 7}), 2.0, None)  # type: ignore[arg-type]
    reply = on_report(job, _held(2, 12, {1: 20, 0: 30}), 2.0, None)  # type: ignore[arg-type]
    assert (reply.buddyNodeRank, list(reply.dropWards)) == (0, [])  # node 1's copy stays: its node is lost
    job.agents[1] = _Agent("h", 99)  # the replacement
    reply = on_report(job, _held(1, 99, {}, replicated=-1), 3.0, None)  # type: ignore[arg-type]
    assert (reply.holderNodeRank, reply.holderStep) == (2, 20)
    assert list(on_report(job, _held(2, 12, {1: 20, 0: 30}), 3.0, None).dropWards) == []  # type: ignore[arg-type]
    on_report(job, _held(0, 10, {2: 7}), 4.0, None)  # type: ignore[arg-type]  # node 0 copied to node 1 now
    on_report(job, _held(1, 99, {0: 31}), 4.0, None)  # type: ignore[arg-type]
    reply = on_report(job, _held(2, 12, {1: 20, 0: 30}), 4.0, None)  # type: ignore[arg-type]
    assert list(reply.dropWards) == [0]  # node 1, its own buddy node 2 again, is not dropped: its pushes land here
