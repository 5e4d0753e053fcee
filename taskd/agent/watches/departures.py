"""A live group's rank that exits 0 before its loop ended: finished early, or left its group early?

Early stopping (every rank breaks out of ``live.steps()``) and a rank that leaves while its peers train on
(a ``return`` or ``sys.exit(0)`` of one rank) both exit 0 without the "loop complete" mark (Phase.COMPLETE).
Only the peers tell them apart: a group left early breaks, so its peers report the failed collective
(PAUSED) or sit in it. Without this watch the exit counted as a success and the peers waited out the
rejoin timeout for a generation nobody named (issue 21, "leaving early").

Local peers only: a rank whose group peers all run on other nodes is not judged here (docs/pytorch.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from taskd.agent.ranks.table import Rank, RankState, RankTable
from taskd.worker.live import Phase, RankStatus

log = logging.getLogger(__name__)

WATCH = 10.0  # seconds after the exit in which the peers' breaking group counts as evidence
HOLD = 1.0  # a peer inside a collective this long since the exit waits on the one that left


@dataclass(frozen=True)
class Departure:
    rank: Rank
    pid: int
    step: int | None  # its last completed step
    at: float  # time.time() of the exit: compared with the peers' own collective marks (their wall clock)
    until: float  # time.monotonic() after which the peers' silence makes it a finish (WATCH): no wall-clock step


class DepartureWatch:
    """Exits 0 of group ranks before their loop's end, judged by what their local peers do next."""

    def __init__(self, table: RankTable) -> None:
        self.table = table
        self._open: dict[int, Departure] = {}  # local rank -> its exit

    def exited(self, rank: Rank, status: RankStatus | None, in_group: bool, now: float | None = None,
               mono: float | None = None) -> bool:
        """Note a rank's exit 0; True when it is one to watch (a group rank whose loop had not ended)."""
        if status is None or not in_group or not status.can_rejoin or status.phase is Phase.COMPLETE \
                or rank.pid is None:
            return False
        if not any(r.local_rank != rank.local_rank for r in self.table.in_state(RankState.RUNNING)):
            return False  # the last one out: nobody to leave
        self._open[rank.local_rank] = Departure(rank, rank.pid, status.heartbeat.step,
                                                time.time() if now is None else now,
                                                (time.monotonic() if mono is None else mono) + WATCH)
        log.info("rank %d (pid %d) exited 0 before its loop's end (last step %s): its peers tell whether it left "
                 "them or the job stops early", rank.global_rank, rank.pid, status.heartbeat.step)
        return True

    @property
    def watching(self) -> bool:
        return bool(self._open)

    def left(self, peers: dict[int, RankStatus], now: float | None = None,
             mono: float | None = None) -> list[tuple[Departure, str]]:
        """The departures their peers' broken group gives away, with why; ``peers`` are the running ranks'
        statuses by local rank. Each departure is judged once: given away, or dropped after WATCH."""
        if not self._open:
            return []
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        found = []
        for local_rank, d in list(self._open.items()):
            if d.rank.pid != d.pid or d.rank.state is not RankState.SUCCEEDED:
                del self._open[local_rank]  # restarted, or already judged otherwise
                continue
            paused = sorted(self.table[lr].global_rank for lr, s in peers.items() if s.phase is Phase.PAUSED)
            waiting = sorted(self.table[lr].global_rank for lr, s in peers.items() if s.collective_since is not None
                             and now - max(s.collective_since, d.at) >= HOLD)
            if paused or waiting:
                del self._open[local_rank]
                whom = f"rank(s) {paused} lost their group" if paused else f"rank(s) {waiting} wait on it"
                found.append((d, f"it exited 0 after step {d.step}, before its loop's end, and {whom}"))
            elif mono >= d.until or not peers:
                del self._open[local_rank]
                log.debug("rank %d exited early: its peers trained on or ended; it finished", d.rank.global_rank)
        return found


__all__ = ["Departure", "DepartureWatch"]
