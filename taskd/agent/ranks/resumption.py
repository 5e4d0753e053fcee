"""When training resumed after a restart that is not a live rebuild (recover of independent ranks,
job-rescheduling, the degraded local restart): read from the ranks' heartbeat files.

A restart only starts processes; a replacement then loads a checkpoint and recomputes before it is
training again. Training has resumed once every rank restarted in the round has written a heartbeat
from its new incarnation (a file counts only if its pid is the rank's current one) naming a step, if its
previous incarnation named steps (a beat without one, such as a framework callback's at the start of
training, comes before the first step: counted, it made a job-rescheduling's line say one rank "sent a
heartbeat" while its peer was at step 33); survivors never stopped.
The agent polls the files (`Supervisor` wakes every ``POLL`` while one is pending), so the
time it prints is when it saw the heartbeat, within ~one poll of it, and the step it names may be
later than the first one the rank completed. Ranks that never wrote a heartbeat cannot say they
resumed: the record then says so instead of pretending the restart was the end of the recovery.
A fresh agent (a replacement or standby taking a lost node) has seen no heartbeat yet, so it cannot know
whether its ranks write any: it watches for them anyway, for at most ``UNSURE_LIMIT`` seconds, then says it
cannot tell (with the restores its ranks recorded, which the controller's round account keeps either way).
Live rebuilds confirm their own resumption (agent/ranks/live.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from taskd.agent.ranks.table import Rank, RankTable
from taskd.agent.summary import ELSEWHERE, NO_HEARTBEATS, PENDING, SUPERSEDED, RecoveryRecord, describe_restores
from taskd.worker.heartbeat_file import HeartbeatState
from taskd.worker.snapshot_account import Restored

log = logging.getLogger("taskd.agent")

UNSURE_LIMIT = 60.0  # s a fresh agent waits for its restarted ranks' first heartbeats before saying it cannot tell


@dataclass
class _Pending:
    record: RecoveryRecord
    started: float  # monotonic time of the fault
    pids: dict[int, int | None]  # local rank -> pid of the incarnation started by the restart
    steps_before: dict[int, int | None]  # local rank -> last step its previous incarnation reported
    unsure: bool = False  # no heartbeat seen on this node yet: the ranks may write none (bounded by UNSURE_LIMIT)


class Resumption:
    """Watch one restart at a time until every restarted rank reports a step (or the next restart)."""

    def __init__(self, table: RankTable, heartbeat: Callable[[Rank], HeartbeatState | None],
                 restored: Callable[[Rank], Restored | None] = lambda _rank: None) -> None:
        self.table = table
        self._heartbeat = heartbeat  # the rank's heartbeat state, None unless its current pid wrote it
        self._restored = restored  # where the rank's restore came from, as it told (taskd.worker.snapshot_account)
        self.restores: list[Restored] = []  # the last resumption's, for the controller's account
        self._beats = False  # some rank of this node has written a heartbeat: resumption can be seen
        self._fresh = False  # the last start was this agent's first (a replacement's): no rank could have beaten
        self._pending: _Pending | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def steps(self, local: list[int]) -> dict[int, int | None]:
        """Before a restart: each rank's last reported step (its old incarnation's file is still there)."""
        found: dict[int, int | None] = {}
        self._fresh = all(rank.pid is None for rank in self.table.all())
        for rank in self.table.all():
            state = self._heartbeat(rank) if rank.pid is not None else None
            if state is not None and state.started:
                self._beats = True
            if rank.local_rank in local:
                found[rank.local_rank] = state.step if state is not None else None
        return found

    def track(self, record: RecoveryRecord, local: list[int], steps_before: dict[int, int | None],
              started: float) -> None:
        """After a restart of the local ranks ``local``: watch for their first heartbeats."""
        self.supersede()
        if not local:
            record.resumption = ELSEWHERE
            return
        if not self._beats and not self._fresh:
            record.resumption = NO_HEARTBEATS
            return
        pids = {lr: self.table[lr].pid for lr in local}
        self._pending = _Pending(record, started, pids, steps_before, unsure=not self._beats)

    def supersede(self) -> None:
        """A newer restart replaces the one being watched: its resumption will not be seen."""
        if self._pending is not None and self._pending.record.resumption == PENDING:
            self._pending.record.resumption = SUPERSEDED
        self._pending = None

    def check(self, now: float) -> float | None:
        """Every ``POLL`` while pending: log "training resumed" once every restarted rank reported a step, and
        return the seconds from the fault (None: not yet, or nothing pending)."""
        p = self._pending
        if p is None:
            return None
        seen: dict[int, HeartbeatState] = {}
        for lr, pid in p.pids.items():
            rank = self.table[lr]
            state = self._heartbeat(rank) if rank.pid == pid and pid is not None else None
            if state is None or state.time <= 0.0:
                return None
            if state.step is None and p.steps_before.get(lr) is not None:
                return None  # beating, but not past a step yet, where the rank's steps are known to be told
            seen[lr] = state
        self._pending, self._beats = None, True
        seconds = now - p.started
        p.record.resumed_at(seconds)
        self.restores = self.restored_since(p.pids, p.record.started - p.record.restart_seconds)
        p.record.restored = describe_restores(self.restores)
        log.info("training resumed %.3fs after the fault (%s; %s)%s", seconds, p.record.strategy,
                 "; ".join(self._describe(lr, seen[lr], p.steps_before.get(lr), p.record.ranks)
                           for lr in sorted(seen)), f"; {p.record.restored}" if p.record.restored else "")
        return seconds

    def expire(self, now: float) -> bool:
        """Every ``POLL`` while pending: True once a fresh agent's watch gave up (no heartbeat within
        ``UNSURE_LIMIT``): the record says so, ``restores`` holds what its ranks recorded all the same."""
        p = self._pending
        if p is None or not p.unsure or now - p.started < UNSURE_LIMIT:
            return False
        self._pending = None
        p.record.resumption = NO_HEARTBEATS
        self.restores = self.restored_since(p.pids, p.record.started - p.record.restart_seconds)
        p.record.restored = describe_restores(self.restores)
        log.info("training's resumption not seen: no heartbeat step from rank(s) %s within %.0fs of the restart%s",
                 ", ".join(str(self.table[lr].global_rank) for lr in sorted(p.pids)), UNSURE_LIMIT,
                 f"; {p.record.restored}" if p.record.restored else "")
        return True

    def restored_since(self, pids: dict[int, int | None], since: float) -> list[Restored]:
        """The restores the ranks ``pids`` (local rank -> the incarnation's pid) recorded after wall time ``since``
        (the round's fault): where each took its state from, as it told (taskd.worker.snapshot_account)."""
        found = [self._restored(self.table[lr]) for lr in sorted(pids)]
        return [r for r, pid in zip(found, (pids[lr] for lr in sorted(pids)), strict=True)
                if r is not None and r.pid == pid and r.at >= since]

    def _describe(self, local_rank: int, state: HeartbeatState, before: int | None, faulty: list[int]) -> str:
        """What was read, and only that: the step seen (maybe later than its first) and the last step of the
        previous incarnation (a fault rank's before its fault; another rank's when the restart stopped it)."""
        global_rank = self.table[local_rank].global_rank
        name = f"rank {global_rank}"
        if state.step is None:
            return f"{name} sent a heartbeat (no step number)"
        text = f"{name} at step {state.step}"
        if before is None:
            return text
        text += f", step {before} {'before the fault' if global_rank in faulty else 'when stopped'}"
        if state.step > before:
            return text
        return f"{text}: it redoes at least {before - state.step + 1} step(s)"


__all__ = ["UNSURE_LIMIT", "Resumption"]
