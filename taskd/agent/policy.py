"""What the agent decides on its own, apart from how it carries it out: pure, clock passed in.

The controller decides recoveries; the agent decides only what it must when the controller cannot:
when to stop waiting for an unreachable or lost controller (degraded mode), how many local restarts
the job may still use, and how long a dump may take. Nothing here touches a process, a socket or
the clock, so unit tests drive every decision directly.
"""

from __future__ import annotations

from dataclasses import dataclass

DUMP_SHARE = 0.8  # of the controller's save deadline: leave it time to hear the result
DUMP_MIN = 1.0  # seconds, however short the controller's deadline


@dataclass
class LocalPolicy:
    """The degraded-mode budget and the agent's own deadlines for one job."""

    max_restarts: int
    controller_timeout: float
    dump_timeout: float
    restarts_used: int = 0
    degraded: bool = False  # no controller: faults are recovered locally

    def spend_restart(self) -> int | None:
        """Take one local restart from the budget: its number (1-based), or None when the budget is spent."""
        if self.restarts_used >= self.max_restarts:
            return None
        self.restarts_used += 1
        return self.restarts_used

    def dump_budget(self, signal_timeout: float | None) -> float:
        """How long ranks may take to save: ours, shortened to 80% of the controller's deadline if it sent one."""
        budget = self.dump_timeout
        if signal_timeout and signal_timeout > 0:
            budget = min(budget, max(DUMP_MIN, signal_timeout * DUMP_SHARE))
        return budget

    def report_retry(self, now: float) -> ReportRetry:
        """The timer of a fault report the controller did not take: retried until `controller_timeout`."""
        return ReportRetry(deadline=now + self.controller_timeout)


@dataclass
class ReportRetry:
    """When to send a refused fault report again: 0.1 s, doubling to 2 s, until the deadline (then degrade)."""

    deadline: float
    delay: float = 0.1
    max_delay: float = 2.0
    next_at: float | None = None  # None: send now

    def due(self, now: float) -> bool:
        return self.next_at is None or now >= self.next_at

    def failed(self, now: float) -> bool:
        """An attempt failed at `now`: True schedules the next one, False means give up (degrade)."""
        if now >= self.deadline:
            return False
        self.next_at = now + self.delay
        self.delay = min(self.delay * 2, self.max_delay)
        return True


@dataclass
class LossTimer:
    """A recovery round waits on the controller's next signal; a controller gone for `timeout` never sends it."""

    timeout: float
    lost_since: float | None = None

    def expired(self, now: float, waiting_on_lost_controller: bool) -> float | None:
        """Seconds the controller has been lost once that reaches `timeout` (then the timer restarts), else None."""
        if not waiting_on_lost_controller:
            self.lost_since = None
            return None
        if self.lost_since is None:
            self.lost_since = now
            return None
        lost_for = now - self.lost_since
        if lost_for < self.timeout:
            return None
        self.lost_since = None
        return lost_for
