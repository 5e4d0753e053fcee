"""When training resumed after a round: the agents say so, the controller keeps the time (issue 17).

A round ends when every agent reported its recover status. For a live rebuild that is when the node's ranks
re-formed their group, before the state hand-over and the first step; for a restart, when the processes
started. Only an agent sees its ranks train again (their heartbeats), so each tells the controller once, after
its recover status (`ReportResumed`: the round, its own seconds, and how long ago its ranks resumed, so that a
report re-sent through a controller outage does not count late), or says it cannot tell (`unseen`: no rank of
it was restarted, or they write no heartbeat steps).

The job keeps one `ResumeWatch`: the round recovering now, or the last one that recovered. Once every node the
round waited for said so, `round_training_resumed` is recorded with the time from the round's start and, for a
node-loss round, from each node's loss, to the last node's resumption; the store keeps both with the round
(`taskd status`), and, per node whose ranks restored from snapshots (issue 33), where from, the step and the steps
redone (`restored`: its ranks' sources, the oldest step restored, the most steps one redid). The watch is in the
job's snapshot: a controller restart between two nodes' reports loses neither. A report for another round (an
older one, once a newer round recovers) is refused 401, and one that puts the resumption before the round's
strategy was chosen 409: nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from taskd.controller.machine.events import Outcome, Record, TrainingResumed
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import JobState, Round
from taskd.vocabulary import Code

S = JobState
Restore = tuple[int, str, int, int]  # (rank, source, step, steps redone; -1: unknown), as ReportResumed says


@dataclass(frozen=True)
class ResumeWatch:
    """One round's nodes saying their ranks train again. Replaced, never changed in place (checkpoint.py)."""

    round: int
    started_at: float  # the round's start (its first fault): the controller's monotonic clock, as every time here
    since: float  # when the round's strategy was chosen: a resumption before it was a failed strategy's
    lost: Mapping[int, float] = field(default_factory=dict)  # a node-loss round's nodes -> when declared lost
    nodes: frozenset[int] | None = None  # the nodes it waits for (those the round closed with); None: still open
    resumed: Mapping[int, float | None] = field(default_factory=dict)  # node -> when it resumed (None: cannot tell)
    done: bool = False  # `round_training_resumed` recorded
    restores: Mapping[int, tuple[Restore, ...]] = field(default_factory=dict)  # node -> its ranks' restores

    def complete(self) -> bool:
        return self.nodes is not None and self.nodes <= self.resumed.keys()


def _open(r: Round) -> ResumeWatch:
    return ResumeWatch(r.number, r.started_at, r.strategy_started_at, dict(r.lost))


def _watch_for(m: Job, number: int) -> ResumeWatch | None:
    """The watch a report of round `number` counts in: the job's, or a new one for the round recovering now."""
    w: ResumeWatch | None = m.resume_watch
    r = m.round
    recovering = r is not None and r.number == number and m.state is S.RECOVERING
    if w is not None and w.round == number and (w.nodes is not None or recovering):
        return w
    return _open(r) if recovering and r is not None else None


def on_training_resumed(m: Job, ev: TrainingResumed, now: float, out: Outcome) -> JobState:
    """Count one node's resumption; record the round's figures once its last node said so."""
    w = _watch_for(m, ev.round)
    n = ev.node_rank
    last = m.resume_watch.round if m.resume_watch is not None and m.resume_watch.nodes is not None else None
    if w is None:
        out.code = Code.OUT_OF_ORDER
        out.info = (f"round {ev.round} is not one job {m.job_id} is recovering or last recovered "
                    f"({'no round recovered yet' if last is None else f'its last: round {last}'}): not counted")
        return m.state
    if n in w.resumed:
        out.info = f"already counted for round {w.round}"
        return m.state
    r = m.round
    if w.nodes is not None and n not in w.nodes:
        out.code = Code.OUT_OF_ORDER
        out.info = f"node {n} took no part in round {w.round} of job {m.job_id}: not counted"
        return m.state
    if w.nodes is None and (r is None or n not in r.statuses):
        out.code = Code.OUT_OF_ORDER
        out.info = f"node {n} has not reported its recover status for round {w.round} yet: not counted"
        return m.state
    at = None if ev.unseen else now - ev.seconds_ago
    if at is not None and at < w.since:
        out.code = Code.INVALID_PARAMS
        out.info = (f"secondsAgo {ev.seconds_ago:g} puts the resumption {w.since - at:.3f}s before round {w.round}'s "
                    "strategy was chosen: not counted")
        return m.state
    w = replace(w, resumed={**w.resumed, n: at},
                restores={**w.restores, n: tuple(ev.restores)} if ev.restores else w.restores)
    detail: dict[str, Any] = {"node_rank": n, "seconds": round(ev.seconds, 6), "unseen": ev.unseen,
                              "since_fault": None if at is None else round(at - w.started_at, 6)}
    if ev.restores:  # where its restarted ranks restored from, and the steps they redo (issue 33)
        detail["restored_from"] = {str(rank): source for rank, source, _step, _redone in ev.restores}
        detail["restored_step"] = {str(rank): step for rank, _source, step, _redone in ev.restores}
        detail["steps_redone"] = node_restored(tuple(ev.restores), held_newest(w.restores))["steps_redone"]
    out.records.append(Record("training_resumed", w.round, detail))
    m.resume_watch = _finish(m, w, out)
    return m.state


def round_recovered(m: Job, r: Round, out: Outcome) -> None:
    """Round `r` closed recovered: it now waits for its nodes' resumptions (those said already count, unless
    they were said under a strategy that failed since)."""
    w = m.resume_watch
    if w is None or w.round != r.number or w.since != r.strategy_started_at:
        w = _open(r)
    nodes = frozenset(r.participants)
    m.resume_watch = _finish(m, replace(w, nodes=nodes, resumed={k: t for k, t in w.resumed.items() if k in nodes},
                                        restores={k: v for k, v in w.restores.items() if k in nodes}), out)


def _finish(m: Job, w: ResumeWatch, out: Outcome) -> ResumeWatch:
    """Record the round's figures once every node of it said so (the time to the last one that could tell); the
    job's info, while it still names that round's end, now says it recovered."""
    if w.done or not w.complete():
        return w
    assert w.nodes is not None
    seen = {n: t for n, t in w.resumed.items() if t is not None}
    detail: dict[str, Any] = {"nodes": sorted(w.nodes), "unseen": sorted(n for n, t in w.resumed.items() if t is None)}
    if seen:
        node, t = max(seen.items(), key=lambda item: item[1])
        detail.update(seconds=round(t - w.started_at, 6), last_node=node)
        if m.info.startswith(f"round {w.round} ended "):
            m.info = f"recovered round {w.round}: training resumed {t - w.started_at:.2f}s after its fault"
        if w.lost:
            detail["since_loss"] = {str(k): round(t - lost_at, 6) for k, lost_at in sorted(w.lost.items())}
    if w.restores:
        newest = held_newest(w.restores)
        detail["restored"] = {str(n): node_restored(w.restores[n], newest) for n in sorted(w.restores)}
    out.records.append(Record("round_training_resumed", w.round, detail))
    return replace(w, done=True)


def held_newest(restores: Mapping[int, tuple[Restore, ...]]) -> dict[int, int]:
    """Per step restored, the newest step a rank that restored it held in its own node's memory before the fault:
    how far ranks that restored the same cut had gone (a cut across ranks: they ran in step)."""
    newest: dict[int, int] = {}
    for rows in restores.values():
        for _rank, source, step, redone in rows:
            if source != "buddy" and step >= 0 and redone >= 0:
                newest[step] = max(newest.get(step, -1), step + redone)
    return newest


def node_restored(restores: tuple[Restore, ...], newest: Mapping[int, int] | None = None) -> dict[str, Any]:
    """One node's line of the round's account: its ranks' sources ("buddy", or "disk, memory" when they differ),
    the oldest step one restored, and the most steps one redid (None: none could tell). A rank restored from the
    buddy's copy redoes every step past it that the job had reached, not only those the copy held (it lags):
    the newest step ranks that restored the same step held (``newest``, `held_newest`: they ran in step with the
    lost node's ranks). Ranks that restore steps of their own (scope "rank") share no step, and count as they
    said: a lost node's rank from the newest step its node's agent last reported (`replicas` ``lostNewest``)."""
    newest = newest or {}
    redone = [max(r, newest.get(step, -1) - step) if source == "buddy" else r for _rank, source, step, r in restores]
    redone = [r for r in redone if r >= 0]
    return {"from": ", ".join(sorted({source for _rank, source, _step, _redone in restores})),
            "step": min(step for _rank, _source, step, _redone in restores),
            "steps_redone": max(redone) if redone else None}


# ---------------------------------------------------------------------------- persistence (the job's snapshot)

Times = Callable[[float], float]


def to_json(w: ResumeWatch | None, to_wall: Times) -> dict[str, Any] | None:
    if w is None:
        return None
    return {"round": w.round, "started_at": to_wall(w.started_at), "since": to_wall(w.since),
            "lost": {str(n): to_wall(t) for n, t in w.lost.items()},
            "nodes": None if w.nodes is None else sorted(w.nodes),
            "resumed": {str(n): None if t is None else to_wall(t) for n, t in w.resumed.items()}, "done": w.done,
            "restores": {str(n): [list(r) for r in v] for n, v in w.restores.items()}}


def from_json(d: Mapping[str, Any] | None, from_wall: Times) -> ResumeWatch | None:
    if not d:
        return None
    return ResumeWatch(
        int(d["round"]), from_wall(d["started_at"]), from_wall(d["since"]),
        {int(n): from_wall(t) for n, t in d.get("lost", {}).items()},
        None if d.get("nodes") is None else frozenset(int(n) for n in d["nodes"]),
        {int(n): None if t is None else from_wall(t) for n, t in d.get("resumed", {}).items()}, bool(d.get("done")),
        {int(n): tuple((int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in v)
         for n, v in d.get("restores", {}).items()})


__all__ = ["ResumeWatch", "from_json", "node_restored", "on_training_resumed", "round_recovered", "to_json"]
