"""Snapshot replication across nodes (issue 33, item 3): each node's buddy, chosen here, and what each node holds.

An agent reports every second (taskd.v1 `ReportSnapshots`) where it serves its node's snapshots, the newest step
its ranks published, how far its buddy's copy lags, and whose copy it holds itself (its ward). The answer names
its buddy (`buddy_ring`, the policy: the next live node in ring order, rechosen as nodes are lost and replaced),
the live agent that holds the reporting node's own copy (where a replacement fetches it from) and the key the
job's agents present to each other: the job's credential under the admin token, else (a controller without
one) a random key per job, so that another job's agents are refused either way. When a new agent reports as a
node (a replacement, a standby), the answer also carries how far the node's ranks had got by its previous
agent's last report (`lostNewest`): the replacement's ranks count their steps redone from there.

Soft state, like the pace board: nothing is stored or snapshotted; after a controller restart the reports
rebuild it within a second (a random key changes then, and the agents take the new one with their next answer).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from taskd.controller.machine.job import Job
from taskd.proto import taskd_pb2

STALE = 10.0
"""A node whose last report is older than this (seconds) is no one's buddy: its agent is likely gone."""


def buddy_ring(live: Iterable[int]) -> dict[int, int]:
    """Each live node's buddy: the next live node in ring order (node ranks ascending, the last one's is the
    first); a node alone has none. Pure: the whole policy."""
    ring = sorted(set(live))
    if len(ring) < 2:
        return {}
    return {node: ring[(i + 1) % len(ring)] for i, node in enumerate(ring)}


def obsolete(live: Mapping[int, NodeReport], ring: Mapping[int, int], holder: int) -> list[int]:
    """The copies ``holder`` may drop: of nodes live again whose buddy, another agent, says it holds a copy of
    theirs too. A lost node's copy stays until then, whatever ward the rechosen ring sends the holder meanwhile
    (its first push once removed it, before the lost node's replacement could fetch it). Pure: the whole policy."""
    held = live[holder].wards if holder in live else {}
    return sorted(w for w in held if w in live and (b := ring.get(w, -1)) not in (-1, holder) and b in live
                  and live[b].wards.get(w, -1) >= 0)


@dataclass(frozen=True)
class NodeReport:
    """A node's last report, and when it came (the controller's monotonic clock)."""

    host: str
    pid: int
    address: str
    newest: int
    replicated: int
    lag: float
    ward: int
    ward_step: int
    at: float
    ranks: Mapping[int, int] = field(default_factory=dict)  # each local rank's own newest published step
    wards: Mapping[int, int] = field(default_factory=dict)  # every node whose copy it holds -> its newest step


@dataclass
class ReplicaBoard:
    """One job's latest report per node and its peer key."""

    key: str
    reports: dict[int, NodeReport] = field(default_factory=dict)
    lost: dict[int, Mapping[int, int]] = field(default_factory=dict)
    """Per node, its ranks' newest steps as the node's previous agent last reported them: when a replacement (or
    a standby) reports as that node, how far the lost ranks got, past the copy their buddy held."""

    def live(self, m: Job, now: float) -> dict[int, NodeReport]:
        """The nodes whose report is fresh and comes from the agent the job now has for that node (a lost node's
        old agent, or one gone from its stream, is not live)."""
        out = {}
        for node, r in self.reports.items():
            agent = m.agents.get(node)
            if (agent is not None and (agent.host, agent.pid) == (r.host, r.pid) and agent.gone_since is None
                    and now - r.at <= STALE and r.address):
                out[node] = r
        return out

    def answer(self, m: Job, node: int, now: float) -> taskd_pb2.SnapshotReply:
        live = self.live(m, now)
        buddy = buddy_ring(live).get(node, -1) if node in live else -1
        holders = [(r.wards.get(node, -1), n) for n, r in live.items() if r.wards.get(node, -1) >= 0 and n != node]
        step, holder = max(holders) if holders else (-1, -1)
        ring = buddy_ring(live)
        return taskd_pb2.SnapshotReply(buddyNodeRank=buddy, buddyAddress=live[buddy].address if buddy >= 0 else "",
                                       holderNodeRank=holder, holderAddress=live[holder].address if holder >= 0 else "",
                                       holderStep=step, key=self.key, lostNewest=self.lost.get(node, {}),
                                       dropWards=obsolete(live, ring, node))


def board_of(m: Job, credential: Callable[[str], str] | None) -> ReplicaBoard:
    """The job's board, made at its first report; ``credential(job_id)`` gives the job's credential (None: no
    admin token, a random key)."""
    board: ReplicaBoard | None = m.replicas
    if board is None:
        board = ReplicaBoard(credential(m.job_id) if credential is not None else secrets.token_urlsafe(32))
        m.replicas = board
    return board


def on_report(m: Job, req: taskd_pb2.SnapshotReport, now: float,
              credential: Callable[[str], str] | None) -> taskd_pb2.SnapshotReply:
    board = board_of(m, credential)
    before = board.reports.get(req.nodeRank)
    if before is not None and (before.host, before.pid) != (req.host, req.pid) and before.ranks:
        board.lost[req.nodeRank] = before.ranks  # a new agent for the node: what the old one's ranks had reached
    board.reports[req.nodeRank] = NodeReport(req.host, req.pid, req.address, req.newestStep, req.replicatedStep,
                                             req.lagSeconds, req.wardNodeRank, req.wardStep, now,
                                             dict(req.rankNewest), dict(req.wards) or _one_ward(req))
    return board.answer(m, req.nodeRank, now)


def _one_ward(req: taskd_pb2.SnapshotReport) -> dict[int, int]:
    """An agent that reports no ``wards`` (an older one): the one ward it names."""
    return {req.wardNodeRank: req.wardStep} if req.wardNodeRank >= 0 and req.wardStep >= 0 else {}


def snapshot_records(m: Job, to_wall: Callable[[float], float], now: float) -> list[taskd_pb2.SnapshotRecord]:
    """Each node's replication as its last report said (`taskd status`), its buddy as chosen now."""
    board: ReplicaBoard | None = m.replicas
    if board is None:
        return []
    ring = buddy_ring(board.live(m, now))
    return [taskd_pb2.SnapshotRecord(nodeRank=n, buddyNodeRank=ring.get(n, -1), newestStep=r.newest,
                                     replicatedStep=r.replicated, lagSeconds=r.lag, reportedAt=to_wall(r.at))
            for n, r in sorted(board.reports.items())]


__all__ = ["ReplicaBoard", "board_of", "buddy_ring", "obsolete", "on_report", "snapshot_records"]
