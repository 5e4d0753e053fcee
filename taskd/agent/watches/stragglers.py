"""This node's side of straggler detection (`--straggler-factor`, issue 21 item 5; the judge is taskd/pace.py).

On each sweep the agent reads its ranks' running compute sums from their heartbeat files into a window per
rank; every `--straggler-interval` it sends the windows' averages to the controller (`ReportPace`, a report
of the outbox sent once, beside the others: agent/link/report_policy.py), which
compares every rank of the job with the median of the others and answers with the verdicts about this
node's ranks, each once: they become console lines here. Without a controller that judges (degraded mode,
a ClusterD controller without taskd.v1) the agent judges its own node's ranks with the same judge. With
`--migrate-stragglers` the verdicts go on to agent/watches/straggler_moves.py, which moves a sustained straggler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from taskd.agent.link.reports import Report
from taskd.agent.ranks.table import Rank, RankState
from taskd.agent.watches.straggler_moves import StragglerMoves
from taskd.pace import PaceWindow, RankPace, StragglerJudge, Verdict
from taskd.worker.heartbeat_file import HeartbeatState

log = logging.getLogger("taskd.agent")

BLIND_AFTER = 6  # intervals of running ranks without one reported step: --straggler-factor says it sees nothing...
BLIND_START = 120.0  # ...and no sooner than this many seconds: a rank's start (imports, loading, rendezvous) took
# 75 s on a loaded 2-core host, and a rank that reports its first step reports its compute time with its second

Beats = Callable[[Rank], HeartbeatState | None]  # a rank's heartbeat file as read on this sweep (None: unreadable)


class PaceLink(Protocol):
    def __call__(self, factor: float, paces: list[tuple[int, float, int]], timeout: float
                 ) -> Report | None: ...  # None: no controller to report to


class StragglerWatch:
    """Windows of this node's ranks, the pace report in flight, and the local judge when no controller judges."""

    def __init__(self, factor: float, interval: float, host: str, moves: StragglerMoves | None = None) -> None:
        self.factor = factor
        self.moves = moves  # --migrate-stragglers (agent/watches/straggler_moves.py)
        self.interval = interval
        self.host = host
        self.windows: dict[int, PaceWindow] = {}
        self.local = StragglerJudge(factor)
        self.remote = True  # the controller judges; False once it cannot (no taskd.v1) or there is none
        self.next_at = 0.0
        self._report: Report | None = None  # the pace report not settled yet (its `outcome` then holds the answer)
        self._running_since: float | None = None  # the first sweep that found a running rank
        self._running_until = 0.0  # the last one
        self._stepped = False  # some rank reported a step: its compute time follows with its next one
        self._said_blind = False

    def sample(self, ranks: Iterable[Rank], heartbeat: Beats) -> list[RankPace]:
        """Read each running rank's compute sums into its window; the ranks with a judged pace."""
        out = []
        seen = set()
        for rank in ranks:
            if rank.state is not RankState.RUNNING or rank.pid is None:
                continue
            state = heartbeat(rank)
            if state is None:
                continue
            seen.add(rank.global_rank)
            window = self.windows.setdefault(rank.global_rank, PaceWindow())
            window.observe(rank.pid, state.compute, state.compute_intervals)
            self._stepped = self._stepped or state.beats > 0
            seconds = window.seconds()
            if seconds is not None:
                out.append(RankPace(rank.global_rank, self.host, seconds, window.intervals))
        for gone in [r for r in self.windows if r not in seen]:
            del self.windows[gone]
        return out

    def sweep(self, ranks: Iterable[Rank], heartbeat: Beats, link: PaceLink | None,
              now: float) -> list[Verdict]:
        """One sweep: the answer to the report in flight, then (when due) the next report; the verdicts to say
        (and, with --migrate-stragglers, acted on)."""
        ranks = list(ranks)
        paces = self.sample(ranks, heartbeat)
        self._say_if_blind(ranks, now)
        verdicts = self._answer()
        due = now >= self.next_at and self._report is None
        verdicts += self._judged(paces, link, now) if due else []
        if self.moves is not None:
            if due:
                self.moves.standing(paces, now)  # the same figures the report carries, on the same clock
            self.moves.act(verdicts, now)
        return verdicts

    def _judged(self, paces: list[RankPace], link: PaceLink | None, now: float) -> list[Verdict]:
        """A pace report is due: send it, or, with no controller that judges, judge here."""
        self.next_at = now + self.interval
        if self.remote and link is not None:
            self._report = link(self.factor, [(p.rank, p.seconds, p.intervals) for p in paces], self.interval)
            if self._report is not None:
                return []
        return self.local.judge(paces)

    def _say_if_blind(self, ranks: list[Rank], now: float) -> None:
        """One console line when the ranks have run BLIND_AFTER intervals (BLIND_START seconds at least) and none
        reported a step (a script that sends no heartbeats): the flag would otherwise do nothing and say nothing.
        Once a rank reported one it never fires: its compute time comes with its next."""
        if self._stepped or self._said_blind or not any(r.state is RankState.RUNNING for r in ranks):
            return
        if self._running_since is None:
            self._running_since = now
        self._running_until = now
        if now - self._running_since >= max(BLIND_AFTER * self.interval, BLIND_START):
            self._say_blind("since the ranks started", "can be")

    def _say_blind(self, span: str, can: str) -> None:
        self._said_blind = True
        log.warning("--straggler-factor %g: no rank reported a step in the %.0fs %s (a script that sends no heartbeats "
                    "names none: call taskd.worker.heartbeat(step) each step, or use LiveGroup), so no straggler %s "
                    "named", self.factor, self._running_until - (self._running_since or 0.0), span, can)

    def _answer(self) -> list[Verdict]:
        outcome = self._report.outcome if self._report is not None else None
        if outcome is None:
            return []
        self._report = None
        if not outcome.taken:
            if "UNIMPLEMENTED" in outcome.why:
                self.remote = False
                log.info("the controller does not judge stragglers (no taskd.v1 ReportPace): this node's ranks are "
                         "compared among themselves")
            else:
                log.debug("pace report: %s", outcome.why)
            return []
        return [Verdict(v.rank, v.host, v.ratio, v.computeSeconds, v.medianSeconds, v.cleared)
                for v in outcome.reply.verdicts]

    def close(self) -> None:
        """The ranks ended: a job shorter than BLIND_START whose ranks ran BLIND_AFTER intervals without one step is
        told now that the flag named nothing (said once, as during the run)."""
        self._report = None  # the outbox drops a pace report still pending when the ranks end (Reporter.finished)
        ran = self._running_until - self._running_since if self._running_since is not None else 0.0
        if not (self._stepped or self._said_blind) and ran >= BLIND_AFTER * self.interval:
            self._say_blind("the ranks ran", "could be")
