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
from typing import Any, Protocol

from taskd.agent.link.reports import Report
from taskd.agent.ranks.table import Rank, RankState
from taskd.pace import PaceWindow, RankPace, StragglerJudge, Verdict

log = logging.getLogger("taskd.agent")

BLIND_AFTER = 6  # intervals of running ranks without one compute sample: --straggler-factor says it sees nothing


class PaceLink(Protocol):
    def __call__(self, factor: float, paces: list[tuple[int, float, int]], timeout: float
                 ) -> Report | None: ...  # None: no controller to report to


class StragglerWatch:
    """Windows of this node's ranks, the pace report in flight, and the local judge when no controller judges."""

    def __init__(self, factor: float, interval: float, host: str, moves: Any = None) -> None:
        self.factor = factor
        self.moves = moves  # --migrate-stragglers: a StragglerMoves (agent/watches/straggler_moves.py), else None
        self.interval = interval
        self.host = host
        self.windows: dict[int, PaceWindow] = {}
        self.local = StragglerJudge(factor)
        self.remote = True  # the controller judges; False once it cannot (no taskd.v1) or there is none
        self.next_at = 0.0
        self._report: Report | None = None  # the pace report not settled yet (its `outcome` then holds the answer)
        self._running_since: float | None = None  # the first sweep that found a running rank
        self._seen = False  # some rank reported a step's compute time: the watch can see
        self._said_blind = False

    def sample(self, ranks: Iterable[Rank], heartbeat: Callable[[Rank], Any]) -> list[RankPace]:
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
            self._seen = self._seen or state.compute_intervals > 0
            seconds = window.seconds()
            if seconds is not None:
                out.append(RankPace(rank.global_rank, self.host, seconds, window.intervals))
        for gone in [r for r in self.windows if r not in seen]:
            del self.windows[gone]
        return out

    def sweep(self, ranks: Iterable[Rank], heartbeat: Callable[[Rank], Any], link: PaceLink | None,
              now: float) -> list[Verdict]:
        """One sweep: the answer to the report in flight, then (when due) the next report; the verdicts to say
        (and, with --migrate-stragglers, acted on)."""
        verdicts = self._judged(ranks, heartbeat, link, now)
        if self.moves is not None:
            self.moves.act(verdicts, now)
        return verdicts

    def _judged(self, ranks: Iterable[Rank], heartbeat: Callable[[Rank], Any], link: PaceLink | None,
                now: float) -> list[Verdict]:
        ranks = list(ranks)
        paces = self.sample(ranks, heartbeat)
        self._say_if_blind(ranks, now)
        verdicts = self._answer()
        if now < self.next_at or self._report is not None:
            return verdicts
        self.next_at = now + self.interval
        if self.remote and link is not None:
            self._report = link(self.factor, [(p.rank, p.seconds, p.intervals) for p in paces], self.interval)
            if self._report is not None:
                return verdicts
        return verdicts + self.local.judge(paces)

    def _say_if_blind(self, ranks: list[Rank], now: float) -> None:
        """One console line when the ranks have run BLIND_AFTER intervals and none reported a step's compute
        time (a script that sends no heartbeats): the flag would otherwise do nothing and say nothing."""
        if self._seen or self._said_blind or not any(r.state is RankState.RUNNING for r in ranks):
            return
        if self._running_since is None:
            self._running_since = now
        waited = now - self._running_since
        if waited >= BLIND_AFTER * self.interval:
            self._said_blind = True
            log.warning("--straggler-factor %g: no rank reported a step's compute time in the %.0fs since the ranks "
                        "started (the script sends no heartbeats: call taskd.worker.heartbeat(step) each step, or "
                        "use LiveGroup), so no straggler can be named", self.factor, waited)

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
        self._report = None  # the outbox drops a pace report still pending when the ranks end (Reporter.finished)
