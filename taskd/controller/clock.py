"""The controller's two clocks: a monotonic one for every deadline, the wall clock for the record.

Deadlines (agent loss, a round's phases, the join and node-rejoin timeouts) are differences of times
read in one process: a monotonic clock measures them exactly, whatever NTP or an operator does to the
wall clock (a wall clock stepped back an hour used to delay an agent's loss by that hour). What is
stored and shown (history, `taskd status`) is wall time, the only clock that means something to a
reader and across a restart.

The rule at the boundary: a time is persisted as the wall time it corresponds to now
(`to_wall(t) = wall() - (monotonic() - t)`), and restored as the monotonic time that lies as far in the
past as the wall clock says (`from_wall(w) = monotonic() - (wall() - w)`), never in the future (a wall
clock stepped back while the controller was down cannot make a stamp lie ahead). Every persisted
deadline is a stamp plus a configured timeout, never a stored instant of its own, so it comes back
with at most its whole timeout left.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    """`monotonic` for deadlines and durations, `wall` for what is stored and shown (both passed in by tests).

    The offset between the two is read once and kept while it holds to within `STEP` (1 ms): conversions are
    then exact inverses of each other within the process, and a real step of the wall clock is taken on."""

    STEP = 0.001

    __slots__ = ("monotonic", "wall", "_offset")

    def __init__(self, monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.monotonic = monotonic
        self.wall = wall
        self._offset: float | None = None

    def now(self) -> float:
        return self.monotonic()

    def offset(self) -> float:
        """wall - monotonic, as it stands (kept while it moves less than STEP)."""
        current = self.wall() - self.monotonic()
        if self._offset is None or abs(current - self._offset) > self.STEP:
            self._offset = current
        return self._offset

    def to_wall(self, t: float) -> float:
        """The wall time of monotonic time `t` (of this process)."""
        return t + self.offset()

    def frozen(self) -> Callable[[float], float]:
        """`to_wall` with the offset read once, for the many times one transaction stores (a job's snapshot
        converts a dozen, a group commit every job's): two clock reads per time were 7 % of a fault round's own
        cost (bench/controller_core.py). Within one transaction the offset holds anyway (STEP)."""
        off = self.offset()
        return lambda t: t + off

    def from_wall(self, w: float) -> float:
        """The monotonic time of stored wall time `w`, re-based to now and never in the future."""
        return min(w - self.offset(), self.monotonic())


def identity(t: float) -> float:
    return t
