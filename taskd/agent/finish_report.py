"""ReportFinished, delivered: sent until the controller acknowledges it, within one deadline.

A node whose finish the controller never hears of is, after `--agent-loss-timeout`, a lost node: the
controller would end the healthy nodes' job. Sent once, the report is lost whenever the controller is
restarting as the node ends (issue 17, N1). So it is a pending item with one budget (the agent's
controller timeout): re-sent after a short pause while the controller is unreachable or cannot store
it, given up on only when sending again cannot help (invalid, or this agent was fenced) or the budget
is spent. It is sent from its own thread, so that the agent's last seconds (the multi-node job-end
wait, msrun's scheduler) run meanwhile; the agent waits for it before it exits (`ControllerLink.close`).

`FinishReport` is the policy, a function of its inputs (the clock is passed in); `deliver` runs it
(in the thread controller_link.py starts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from taskd.client.errors import FencedError
from taskd.vocabulary import Code

log = logging.getLogger("taskd.agent")

FIRST_PAUSE = 0.2  # seconds before the first re-send; doubled up to MAX_PAUSE
MAX_PAUSE = 2.0  # a restarted controller answers within seconds: do not sleep through its return
ATTEMPT_TIMEOUT = 5.0  # the longest one send may take (gRPC waits for the channel within it)
FINAL = frozenset({Code.INVALID_PARAMS, Code.FENCED})  # the same report would be refused again


@dataclass(frozen=True)
class Step:
    """What to do after an answer: `done` (why), or send again after `pause` seconds."""

    done: bool
    pause: float = 0.0
    why: str = ""


@dataclass
class FinishReport:
    """One node's finish report and its delivery so far (monotonic times)."""

    exit_code: int
    reason: str
    started: float
    budget: float
    attempts: int = 0
    last: str = "not sent yet"
    delivered: bool = False

    @property
    def deadline(self) -> float:
        return self.started + self.budget

    def attempt_timeout(self, now: float) -> float:
        """The deadline of the next send: the time left, at most ATTEMPT_TIMEOUT, at least 50 ms."""
        return max(0.05, min(ATTEMPT_TIMEOUT, self.deadline - now))

    def answer(self, code: int | None, now: float, detail: str = "") -> Step:
        """After a send answered `code` (None: no answer, e.g. unreachable) at `now`."""
        self.attempts += 1
        self.last = detail or ("no answer" if code is None else f"answer {code}")
        if code == Code.OK:
            self.delivered = True
            return Step(True, why="acknowledged")
        if code in FINAL:
            return Step(True, why=f"refused ({self.last}): sending it again cannot help")
        pause = min(MAX_PAUSE, FIRST_PAUSE * 2 ** min(self.attempts - 1, 16))
        if now + pause >= self.deadline:
            return Step(True, why=f"not acknowledged within {self.budget:.0f}s ({self.attempts} attempt(s), last: "
                                  f"{self.last})")
        return Step(False, pause=pause, why=self.last)


def deliver(report: FinishReport, send: Callable[[FinishReport, float], int],
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Send `report` (send(report, timeout) -> the controller's code) until `report.answer` says it is done."""
    while True:
        detail = ""
        try:
            code: int | None = send(report, report.attempt_timeout(clock()))
        except FencedError as exc:
            code, detail = Code.FENCED, str(exc)
        except Exception as exc:  # unreachable, or a failure inside the controller: sent again
            code, detail = None, str(exc)
        step = report.answer(code, clock(), detail)
        if step.done:
            break
        log.info("the controller has not acknowledged this node's finish yet (%s): sending it again in %.1fs",
                 step.why, step.pause)
        sleep(step.pause)  # this thread's own pause: the agent's loop has ended
    if report.delivered and report.attempts > 1:
        log.info("the controller acknowledged this node's finish after %d attempts (%.1fs)", report.attempts,
                 clock() - report.started)
    elif not report.delivered:
        log.warning("the controller did not take this node's finish report: %s; it may count this node as lost",
                    step.why)


__all__ = ["ATTEMPT_TIMEOUT", "FinishReport", "Step", "deliver"]
