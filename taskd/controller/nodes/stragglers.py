"""Stragglers across the job (issue 21, item 5): every agent's pace reports, judged against the whole job.

An agent reports its running ranks' recent compute seconds per step (`ReportPace`, every
`--straggler-interval` while `--straggler-factor` is set). The controller keeps each node's latest report
and judges every rank against the median of all the job's other ranks (`taskd.pace.StragglerJudge`, with
its hysteresis), so a slow rank is named even when it is its node's only rank. A verdict is recorded as a
history event (`straggler`, or `straggler_cleared`), kept in the job's `stragglers` (`taskd status`), and
handed once to the agent of the rank's node in the answer to its next report (its console line).

Soft state: nothing here is snapshotted. After a controller restart the reports rebuild it within one
interval (a straggler still slow is then reported again). No action is taken: operators act on the event,
the metric or `taskd status` (docs/operations.md, "Stragglers").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from taskd.controller.machine.events import Outcome, PaceReported
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import TERMINAL, JobState
from taskd.pace import RankPace, StragglerJudge, Verdict
from taskd.proto import taskd_pb2

STALE = 60.0
"""A node whose last pace report is older than this (seconds) is left out of the comparison."""


@dataclass(frozen=True)
class Straggler:
    """A verdict as the job keeps it: whose node, and when (the controller's monotonic clock)."""

    verdict: Verdict
    node_rank: int
    at: float


@dataclass
class PaceBoard:
    """One job's latest pace per node, its judge, and the verdicts each node has yet to be told."""

    judge: StragglerJudge
    reports: dict[int, tuple[float, tuple[RankPace, ...]]] = field(default_factory=dict)  # node -> (at, paces)
    current: dict[int, Straggler] = field(default_factory=dict)  # rank -> its standing straggler verdict
    pending: dict[int, list[Straggler]] = field(default_factory=dict)  # node -> verdicts its agent is owed

    def report(self, node_rank: int, host: str, paces: tuple[tuple[int, float, int], ...], now: float
               ) -> list[Straggler]:
        self.reports[node_rank] = (now, tuple(RankPace(r, host, s, n) for r, s, n in paces))
        owner = {}
        fresh = []
        for node, (at, ranks) in list(self.reports.items()):
            if now - at > STALE:
                del self.reports[node]
                continue
            for p in ranks:
                owner[p.rank] = node
                fresh.append(p)
        out = [Straggler(v, owner[v.rank], now) for v in self.judge.judge(fresh)]
        for s in out:
            if s.verdict.cleared:
                self.current.pop(s.verdict.rank, None)
            else:
                self.current[s.verdict.rank] = s
            self.pending.setdefault(s.node_rank, []).append(s)
        for rank in [r for r in self.current if r not in self.judge.reported]:  # gone: restarted, finished
            del self.current[rank]
        return out

    def take(self, node_rank: int) -> list[Straggler]:
        """The verdicts about `node_rank`'s ranks not yet handed to its agent (each handed once)."""
        return self.pending.pop(node_rank, [])


def board_of(m: Job, factor: float) -> PaceBoard:
    board: PaceBoard | None = getattr(m, "paces", None)
    if board is None or board.judge.factor != factor:
        board = PaceBoard(StragglerJudge(factor))
        m.paces = board  # type: ignore[attr-defined]
    return board


def on_pace(m: Job, ev: PaceReported, now: float, out: Outcome) -> JobState:
    """Judge the job's ranks with this node's new pace; record each verdict (no action is taken)."""
    if m.state in TERMINAL:
        return m.state
    board = board_of(m, ev.factor)
    for s in board.report(ev.node_rank, ev.host, ev.paces, now):
        v = s.verdict
        m.record(out, "straggler_cleared" if v.cleared else "straggler", rank=v.rank, node_rank=s.node_rank,
                 host=v.host, ratio=round(v.ratio, 3), compute_seconds=round(v.seconds, 6),
                 median_seconds=round(v.median, 6), factor=ev.factor)
    return m.state


def straggler_records(m: Job | None, to_wall: Callable[[float], float], node_rank: int | None = None
                      ) -> list[taskd_pb2.StragglerRecord]:
    """The job's standing stragglers (`taskd status`), or, for `node_rank`, the verdicts about that node's ranks
    its agent has not been handed yet (each once: its console line)."""
    board: PaceBoard | None = m.paces if m is not None else None
    if board is None:
        return []
    chosen = board.take(node_rank) if node_rank is not None else sorted(board.current.values(),
                                                                         key=lambda s: s.verdict.rank)
    return [taskd_pb2.StragglerRecord(rank=s.verdict.rank, nodeRank=s.node_rank, host=s.verdict.host,
                                      ratio=s.verdict.ratio, computeSeconds=s.verdict.seconds,
                                      medianSeconds=s.verdict.median, since=to_wall(s.at), cleared=s.verdict.cleared)
            for s in chosen]
