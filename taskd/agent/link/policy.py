"""What the agent decides on its own, apart from how it carries it out: pure, clock passed in.

The controller decides recoveries; the agent decides only what it must when the controller cannot:
when to stop waiting for a lost controller (degraded mode). When to re-send a report is
agent/link/report_policy.py's; the degraded-mode budget and the dump's deadline are the round machine's
(agent/round/states.py, `LocalPolicy`). Nothing here touches a process, a socket or the clock, so unit
tests drive every decision directly.
"""

from __future__ import annotations

from dataclasses import dataclass


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
