"""The agent's reports to the controller as pending items its loop polls: one retry policy, one deadline each.

The loop never waits on the controller. Each attempt is one RPC started and not waited for (the client's
`start_report`: a gRPC future whose completion wakes the loop); the loop reads the answer on its next turn
and `ReportRetry` (agent/policy.py, pure, clock passed in) says when to send again and why. Reports go out
one at a time in the order they were made (the controller expects a node's stop-complete before its
strategies, its strategies before its status). A report the controller has not taken by its deadline
settles as not taken: for a fault report the supervisor then degrades, for the others the round's own
timers decide. The one blocking step is the re-Register (and re-Init) before re-sending after an
"unknown agent/job" answer: the controller just answered, and each call is bounded by ``RESYNC_TIMEOUT``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from taskd.agent.policy import ReportRetry
from taskd.client import RecoverClient
from taskd.client.errors import FencedError, RecoverClientError
from taskd.client.retry import AnswerKind, classify
from taskd.client.rpc import PendingCall
from taskd.vocabulary import Code, FaultRanks

log = logging.getLogger("taskd.agent")

RESYNC_TIMEOUT = 1.0  # each of the re-Init and re-Register calls before re-sending a report
FLUSH_TIMEOUT = 5.0  # the longest the agent's last moments wait for reports still pending
FAULT = "fault report"
STRATEGIES = "strategies"  # a node's strategies for a round: a new stopTrain withdraws them (Outbox.drop)
STATUS = "recover status"  # a node's recover status: a new stopTrain withdraws it too (round_events.WithdrawReports)


@dataclass
class Report:
    """One report until the controller takes it or its deadline passes."""

    what: str  # "fault report", "stop complete", ... (what the log lines name)
    method: str  # the RPC
    build: Callable[[RecoverClient, Report], Any]  # the request, built when sent (a fault report's faults grow)
    retry: ReportRetry
    faults: FaultRanks = field(default_factory=dict)  # a fault report's ranks (later faults join it)
    detail: str = ""
    call: PendingCall | None = None
    resync: tuple[bool, bool] = (False, False)  # (re-Init, re-Register) before the next send
    # informational (agent/resumed_report.py): the controller's first answer settles it (but "busy": sent again),
    # and so does a controller without the method, so that it never holds back the reports behind it
    lossy: bool = False

    def join(self, faults: FaultRanks, detail: str) -> None:
        """A later fault goes with this report (re-sent whole if an attempt without it is in flight)."""
        self.faults.update(faults)
        self.detail = f"{self.detail}; {detail}" if self.detail else detail


@dataclass(frozen=True)
class Settled:
    """A report that left the outbox: taken by the controller, or not within its deadline."""

    report: Report
    taken: bool
    why: str = ""


class Outbox:
    """The pending reports of one agent, sent in order from the agent's loop."""

    def __init__(self, client: Callable[[], RecoverClient | None], wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._wake = wake
        self._clock = clock
        self._queue: deque[Report] = deque()
        self._stale: set[int] = set()  # id of a fault report whose in-flight attempt lacks a later fault
        self.fenced: str | None = None  # a 411 answer's info: this agent was fenced, no report will be taken again

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, report: Report) -> None:
        self._queue.append(report)

    def drop(self, what: str) -> int:
        """Forget the pending reports of kind ``what`` (one in flight has its call cancelled): a new order made them
        moot. The number dropped."""
        kept: deque[Report] = deque()
        dropped = 0
        for report in self._queue:
            if report.what != what:
                kept.append(report)
                continue
            if report.call is not None:
                report.call.cancel()
            self._stale.discard(id(report))
            dropped += 1
        self._queue = kept
        return dropped

    def fault(self) -> Report | None:
        """The fault report still pending, if any (a new fault joins it)."""
        return next((r for r in self._queue if r.what == FAULT), None)

    def join_fault(self, faults: FaultRanks, detail: str) -> bool:
        """Add a fault to the pending fault report; False when there is none."""
        report = self.fault()
        if report is None:
            return False
        report.join(faults, detail)
        if report.call is not None:
            self._stale.add(id(report))
        return True

    def wake_at(self) -> float | None:
        """When the loop must poll next (an in-flight call wakes it itself, by `wake`)."""
        if not self._queue:
            return None
        head = self._queue[0]
        if head.call is not None:
            return head.retry.deadline
        return min(head.retry.deadline, head.retry.next_at if head.retry.next_at is not None else 0.0)

    def poll(self, now: float) -> list[Settled]:
        """Read the answer of the call in flight, give up on reports past their deadline, send what is due."""
        settled: list[Settled] = []
        while self._queue:
            head = self._queue[0]
            if head.call is not None and head.call.done():
                done = self._read(head, now)
                if done is not None:
                    settled.append(self._pop(done))
                    continue
            if head.retry.expired(now):
                if head.call is not None:
                    head.call.cancel()
                settled.append(self._pop(Settled(head, False, f"not taken within its deadline ({head.retry.attempts} "
                                                           "attempt(s))")))
                continue
            if head.call is None and head.retry.due(now):
                self._send(head, now)  # not started (a closed channel): re-sent on its timer
            break
        return settled

    def _pop(self, settled: Settled) -> Settled:
        self._queue.popleft()
        self._stale.discard(id(settled.report))
        return settled

    def _read(self, report: Report, now: float) -> Settled | None:
        """The answer of the attempt just completed: settled, or a re-send scheduled (None)."""
        call, report.call = report.call, None
        assert call is not None
        code: int | None
        status = None
        try:
            status = call.result()
            code, error = int(status.code), ""
        except FencedError as exc:
            code, error, status = Code.FENCED, str(exc), None
        except RecoverClientError as exc:
            code, error = None, str(exc)
        if code == Code.FENCED:  # declared lost, its node another agent's: no re-send can help (agent/node_loss.py)
            self.fenced = self.fenced or (error or f"{report.what} refused (411): {status.info if status else ''}")
            return Settled(report, False, f"fenced: {self.fenced}")
        if report.lossy and ((code is not None and classify(code) is not AnswerKind.BUSY) or "UNIMPLEMENTED" in error):
            why = "" if code == Code.OK else error or f"answered {code}: {status.info if status else ''}"
            return Settled(report, code == Code.OK, why)
        if code == Code.OK and id(report) in self._stale:  # taken, but a later fault was not in it: send again
            self._stale.discard(id(report))
            report.retry.next_at = None
            return None
        decision = report.retry.answered(code, now, error)
        if not decision.retry:
            if report.retry.attempts > 1:
                log.info("%s taken after %d attempts", report.what, report.retry.attempts)
            return Settled(report, True)
        report.resync = (decision.reinit, decision.reregister)
        log.warning("%s not taken: %s; re-sending in %.1fs%s", report.what, decision.why, decision.delay,
                    " after re-registering" if decision.reregister else "")
        return None

    def _send(self, report: Report, now: float) -> None:
        client = self._client()
        if client is None:
            report.retry.answered(None, now, "no controller")
            return
        reinit, reregister = report.resync
        report.resync = (False, False)
        try:
            if reinit or reregister:
                client.resync(reinit=reinit, timeout=RESYNC_TIMEOUT)
            report.call = client.start_report(report.method, report.build(client, report),
                                              timeout=report.retry.attempt_timeout(now), on_done=self._wake)
        except FencedError as exc:  # a re-Register refused with 411: see _read
            report.call, report.retry.deadline = None, now
            self.fenced = self.fenced or str(exc)
            return
        except RecoverClientError as exc:
            report.call = None
            decision = report.retry.answered(None, now, str(exc))
            log.warning("%s not sent: %s; again in %.1fs", report.what, decision.why, decision.delay)
            return
        except ValueError as exc:  # BadArgument: no controller could take it, now or later: it settles at once
            report.call = None
            report.retry.deadline = now
            log.error("%s not sent, invalid arguments: %s", report.what, exc)
            return
        report.retry.sent()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> list[Settled]:
        """The agent's last moments: wait (bounded) for the reports still pending, then drop the rest."""
        end = self._clock() + timeout
        settled: list[Settled] = []
        while self._queue and self._clock() < end:
            settled += self.poll(self._clock())
            if self._queue:
                time.sleep(0.01)  # the loop is over: nothing else to do here but wait for the answer
        for report in self._queue:
            if report.call is not None:
                report.call.cancel()
            settled.append(Settled(report, False, "the agent is ending"))
        self._queue.clear()
        return settled


__all__ = ["FAULT", "STATUS", "STRATEGIES", "Outbox", "Report", "Settled"]
