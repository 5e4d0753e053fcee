"""When to send a report again, and how long to wait first: a pure policy plus the jittered backoff.

Jitter matters because a controller restart makes every agent of every job answer or reconnect at
once; spreading the retries keeps the burst under gRPC's pending-request limits. The policy takes
the random draw as an argument, so it is a function of its inputs and unit tests drive it without
a network or a clock.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from taskd.settings import default
from taskd.vocabulary import Code

# The controller does not (or no longer) know this agent: re-register (and re-Init) first.
REREGISTER_CODES = frozenset({Code.NOT_REGISTERED, Code.JOB_NOT_EXIST, Code.NOT_INITIALISED})
# Re-Init before re-registering: the controller lost the job itself.
REINIT_CODES = frozenset({Code.JOB_NOT_EXIST, Code.NOT_INITIALISED})
# The controller is overloaded: just wait and re-send; registering again would only add load.
# 503: the controller could not store the change (disk full, I/O error) and changed nothing: wait and resend.
BUSY_CODES = frozenset({Code.RATE_LIMITED, Code.TOO_MANY_REQUESTS, Code.SIGNAL_QUEUE_BUSY, Code.STORAGE_ERROR})
MIN_CALL_TIMEOUT = 0.05  # the shortest deadline worth giving a call

# What an answer worth re-sending after means, for the log line that says why a report is re-sent.
MEANINGS = {
    Code.STORAGE_ERROR: "the controller could not store it and changed nothing",
    Code.RATE_LIMITED: "the controller is rate-limiting this agent",
    Code.TOO_MANY_REQUESTS: "the controller has too many requests in flight",
    Code.SIGNAL_QUEUE_BUSY: "the controller's signal queue is full",
    Code.NOT_REGISTERED: "the controller does not know this agent: re-registering first",
    Code.JOB_NOT_EXIST: "the controller does not know the job: re-initialising first",
    Code.NOT_INITIALISED: "the controller has not initialised the job: re-initialising first",
    Code.OUT_OF_ORDER: "the controller did not expect it now",
}


def meaning(code: int) -> str:
    """Why answer `code` to a report is worth re-sending, in words (with the code)."""
    try:
        name = Code(int(code))
    except ValueError:
        return f"answer {code}"
    return f"{MEANINGS.get(name, name.name.lower().replace('_', ' '))} ({int(code)})"


def backoff_delay(attempt: int, initial: float, maximum: float, multiplier: float, jitter: float, draw: float) -> float:
    """The pause before retry number `attempt` (0-based): `initial * multiplier**attempt`, capped at
    `maximum`, shortened by `jitter * draw` (draw in [0, 1))."""
    base = min(maximum, initial * multiplier ** min(attempt, 64))
    return base * (1.0 - jitter * draw)


def check_backoff(initial: float, maximum: float, multiplier: float = 2.0, jitter: float = 0.3) -> None:
    if initial <= 0 or maximum < initial or multiplier < 1 or not 0 <= jitter < 1:
        raise ValueError(
            f"bad backoff: initial={initial} maximum={maximum} multiplier={multiplier} jitter={jitter} "
            "(need initial > 0, maximum >= initial, multiplier >= 1, 0 <= jitter < 1)"
        )


class Backoff:
    """Stateful capped exponential backoff with jitter, for the Init and reconnect loops."""

    def __init__(self, initial: float = 0.5, maximum: float = 10.0, multiplier: float = 2.0, jitter: float = 0.3):
        check_backoff(initial, maximum, multiplier, jitter)
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._attempt = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; grows until it reaches the cap."""
        delay = backoff_delay(self._attempt, self.initial, self.maximum, self.multiplier, self.jitter, random.random())
        self._attempt += 1
        return delay

    def reset(self) -> None:
        """Start again from `initial` (after a success)."""
        self._attempt = 0


class AnswerKind(Enum):
    OK = "ok"
    INVALID = "invalid"  # 409: the same request would be refused again
    BUSY = "busy"
    UNKNOWN_AGENT = "unknown agent"  # re-register (maybe re-Init) and re-send, as long as it lasts
    OTHER = "other"  # re-register and re-send once


def classify(code: int) -> AnswerKind:
    if code == Code.OK:
        return AnswerKind.OK
    if code == Code.INVALID_PARAMS:
        return AnswerKind.INVALID
    if code in BUSY_CODES:
        return AnswerKind.BUSY
    if code in REREGISTER_CODES:
        return AnswerKind.UNKNOWN_AGENT
    return AnswerKind.OTHER


@dataclass(frozen=True)
class Decision:
    """Re-send after `delay` s (re-Init / re-register first when asked), or stop and return the code."""

    retry: bool
    delay: float = 0.0
    reinit: bool = False
    reregister: bool = False
    why: str = ""


@dataclass(frozen=True)
class ReportRetryPolicy:
    """Which answers to a report are worth a re-send, within one overall budget.

    Busy answers are re-sent after a pause, as long as they last; "this agent is unknown" answers
    re-register first (re-Init too when the job is unknown); any other code gets one re-register
    and one re-send in the whole report (a later "other" answer ends it); 409 is never re-sent.
    The pause comes before every re-send: immediate re-sends would hit a restarted controller in
    the same burst again. A pause that would not leave room for one more call ends the report.

    For TaskD-API callers only (the blocking `report_*` methods of `DLRecoverManager`, `taskd.api`): they
    may sleep between re-sends. taskd's agent, whose loop must not, never uses it: its reports go through
    its outbox with the one policy of taskd/agent/link/report_policy.py (table in docs/client.md).
    """

    budget: float
    initial: float = default("backoff_initial")  # the client's options (taskd/settings.py), as the manager passes
    maximum: float = default("backoff_max")
    multiplier: float = 2.0
    jitter: float = 0.3

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ValueError(f"report budget must be > 0, got {self.budget}")
        check_backoff(self.initial, self.maximum, self.multiplier, self.jitter)

    def decide(self, code: int, *, attempt: int, elapsed: float, previous: Sequence[int] = (),
               draw: float = 0.0) -> Decision:
        """After answer `code` to send number `attempt` (1-based), `elapsed` s into the report, with the
        earlier answers `previous` (oldest first) and a random `draw` in [0, 1) for the jitter."""
        kind = classify(int(code))
        if kind is AnswerKind.OK:
            return Decision(False, why="accepted")
        if kind is AnswerKind.INVALID:
            return Decision(False, why="refused as invalid")
        if kind is AnswerKind.OTHER and any(classify(c) is AnswerKind.OTHER for c in previous):
            return Decision(False, why="still refused after re-register")
        delay = backoff_delay(attempt - 1, self.initial, self.maximum, self.multiplier, self.jitter, draw)
        if elapsed + delay + MIN_CALL_TIMEOUT >= self.budget:
            return Decision(False, why=f"no time left within its {self.budget:.1f}s deadline")
        return Decision(
            True,
            delay=delay,
            reinit=int(code) in REINIT_CODES,
            reregister=kind is not AnswerKind.BUSY,
            why=meaning(code),
        )
