"""What the agent decides on its own, apart from how it carries it out: pure, clock passed in.

The controller decides recoveries; the agent decides only what it must when the controller cannot:
when to re-send a report, and when to stop waiting for a lost controller (degraded mode). The
degraded-mode budget and the dump's deadline are the round machine's (agent/round_state.py,
`LocalPolicy`). Nothing here touches a process, a socket or the clock, so unit tests drive every
decision directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskd.client.retry import MIN_CALL_TIMEOUT, REINIT_CODES, AnswerKind, Decision, classify, meaning
from taskd.vocabulary import Code

ATTEMPT_TIMEOUT = 5.0  # one attempt's RPC deadline, however far off the report's own deadline is


@dataclass
class ReportRetry:
    """When to send a report again, and why: at once, then 0.1 s doubling to 2 s after each answer that is
    not 0, until the deadline (a fault report not taken by then means degraded mode).

    Every refusal is re-sent until the deadline, since only the deadline decides that the controller is gone.
    An "unknown agent/job" answer re-registers (re-Inits) before the re-send; any other refusal re-registers
    before its first re-send only (the controller may have lost this agent's registration another way)."""

    deadline: float
    delay: float = 0.1
    max_delay: float = 2.0
    next_at: float | None = None  # None: send now
    attempts: int = 0
    reregistered: bool = False

    def due(self, now: float) -> bool:
        return not self.expired(now) and (self.next_at is None or now >= self.next_at)

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def attempt_timeout(self, now: float) -> float:
        """The deadline of an attempt sent at `now`: never past the report's own."""
        return max(MIN_CALL_TIMEOUT, min(ATTEMPT_TIMEOUT, self.deadline - now))

    def sent(self) -> None:
        self.attempts += 1

    def answered(self, code: int | None, now: float, error: str = "") -> Decision:
        """After an attempt: `code` the controller's answer, None when it did not answer (`error` says why).
        A re-send is scheduled (never later than the deadline, where `expired` takes over) unless it was taken."""
        if code == Code.OK:
            return Decision(False, why="accepted")
        reinit = reregister = False
        if code is None:
            why = error or "no answer"
        else:
            why = meaning(code)
            kind = classify(code)
            reinit = code in REINIT_CODES
            reregister = kind is AnswerKind.UNKNOWN_AGENT or (kind is not AnswerKind.BUSY and not self.reregistered)
            self.reregistered = self.reregistered or reregister
        delay = self.delay
        self.next_at = min(now + delay, self.deadline)
        self.delay = min(self.delay * 2, self.max_delay)
        return Decision(True, delay=delay, reinit=reinit, reregister=reregister, why=why)


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
