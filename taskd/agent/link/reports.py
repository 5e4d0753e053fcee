"""The agent's one place to report: every report to the controller goes through `Reporter`, into the outbox.

The loop never waits on the controller. Each attempt is one RPC started and not waited for (the client's
`start_report`: a gRPC future whose completion wakes the loop); the loop reads the answer on its next turn
and `ReportRetry` (agent/link/report_policy.py, pure, clock passed in) says when to send again and why; the kinds
differ only by the data of its table (`KINDS`). Reports go out one at a time in the order they were made (the
controller expects a node's stop-complete before its strategies, its strategies before its status); a pace
report goes beside them, never holding one back. A report the controller has not taken by its deadline
settles as not taken: for a fault report the supervisor then degrades, for the others the round's own timers
decide. The one blocking step is the re-Register (and re-Init) before re-sending after an "unknown agent/job"
answer: the controller just answered, and each call is bounded by ``RESYNC_TIMEOUT``. The finish report,
sent as the agent's loop ends, is polled by a thread of its own, so that the agent's last seconds run meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from taskd.agent.link.registration import Fencing
from taskd.agent.link.report_policy import (
    ATTEMPT_TIMEOUT,
    FAULT,
    FINISH,
    MIGRATION,
    PACE,
    RESTARTS,
    RESUMED,
    STATUS,
    STOP_COMPLETE,
    STRATEGIES,
    ReportKind,
    ReportRetry,
)
from taskd.client import RecoverClient
from taskd.client.errors import FencedError, RecoverClientError
from taskd.client.manager import migration_request, pace_request, resumed_request
from taskd.vocabulary import Code, FaultRanks

log = logging.getLogger("taskd.agent")

RESYNC_TIMEOUT = 1.0  # each of the re-Init and re-Register calls before re-sending a report
FLUSH_TIMEOUT = 5.0  # the longest the agent's last moments wait for reports still pending


@dataclass(eq=False)  # one report is itself: compared and hashed by identity
class Report:
    """One report until the controller takes it or its deadline passes."""

    kind: ReportKind
    build: Callable[[RecoverClient, Report], Any]  # the request, built when sent (a fault report's faults grow)
    retry: ReportRetry
    faults: FaultRanks = field(default_factory=dict)  # a fault report's ranks (later faults join it)
    detail: str = ""
    call: Any = None  # the attempt in flight (a PendingCall)
    resync: tuple[bool, bool] = (False, False)  # (re-Init, re-Register) before the next send
    outcome: Settled | None = field(default=None, repr=False)  # once it left the outbox

    @property
    def what(self) -> str:
        return self.kind.what

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
    reply: Any = None  # the controller's last answer (a pace report's verdicts)


class Outbox:
    """The pending reports of one agent, sent in order from the agent's loop (those not `in_order` beside them)."""

    def __init__(self, client: Callable[[], RecoverClient | None], wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._wake = wake
        self._clock = clock
        self._queue: deque[Report] = deque()
        self._side: list[Report] = []  # reports that wait for no other (ReportKind.in_order False)
        self._stale: set[int] = set()  # id of a fault report whose in-flight attempt lacks a later fault
        self.fenced: str | None = None  # a 411 answer's info: this agent was fenced, no report will be taken again

    def __len__(self) -> int:
        return len(self._queue) + len(self._side)

    def add(self, report: Report) -> None:
        (self._queue.append if report.kind.in_order else self._side.append)(report)

    def drop(self, kind: ReportKind) -> int:
        """Forget the pending reports of `kind` (one in flight has its call cancelled): a new order made them moot.
        The number dropped."""
        gone = [r for r in (*self._queue, *self._side) if r.kind is kind]
        for report in gone:
            if report.call is not None:
                report.call.cancel()
            self._stale.discard(id(report))
        self._queue = deque(r for r in self._queue if r.kind is not kind)
        self._side = [r for r in self._side if r.kind is not kind]
        return len(gone)

    def fault(self) -> Report | None:
        """The fault report still pending, if any (a new fault joins it)."""
        return next((r for r in self._queue if r.kind is FAULT), None)

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
        heads = ([self._queue[0]] if self._queue else []) + self._side
        times = [r.retry.deadline if r.call is not None else
                 min(r.retry.deadline, r.retry.next_at if r.retry.next_at is not None else 0.0) for r in heads]
        return min(times) if times else None

    def poll(self, now: float) -> list[Settled]:
        """Read the answers of the calls in flight, give up on reports past their deadline, send what is due."""
        settled: list[Settled] = []
        for report in list(self._side):
            done = self._step(report, now)
            if done is not None:
                self._side.remove(report)
                settled.append(self._settle(done))
        while self._queue:
            done = self._step(self._queue[0], now)
            if done is None:
                break
            self._queue.popleft()
            settled.append(self._settle(done))
        return settled

    def _step(self, report: Report, now: float) -> Settled | None:
        """One report's turn: its answer read, its deadline checked, its next attempt sent when due."""
        if report.call is not None and report.call.done():
            done = self._read(report, now)
            if done is not None:
                return done
        if report.retry.expired(now):
            if report.call is not None:
                report.call.cancel()
            return Settled(report, False, f"not taken within its deadline ({report.retry.attempts} attempt(s))")
        if report.call is None and report.retry.due(now):
            self._send(report, now)  # not started (a closed channel): re-sent on its timer
        return None

    def _settle(self, settled: Settled) -> Settled:
        self._stale.discard(id(settled.report))
        settled.report.outcome = settled
        return settled

    def _read(self, report: Report, now: float) -> Settled | None:
        """The answer of the attempt just completed: settled, or a re-send scheduled (None)."""
        call, report.call = report.call, None
        code: int | None
        answer = status = None
        try:
            answer = call.result()
            status = getattr(answer, "status", answer)  # a PaceReply holds its Status
            code, error = int(status.code), ""
        except FencedError as exc:
            code, error = Code.FENCED, str(exc)
        except RecoverClientError as exc:
            code, error = None, str(exc)
        if code == Code.FENCED:  # declared lost, its node another agent's: no re-send can help (link/node_loss.py)
            self.fenced = self.fenced or (error or f"{report.what} refused (411): {status.info if status else ''}")
            return Settled(report, False, f"fenced: {self.fenced}", answer)
        if code == Code.OK and id(report) in self._stale:  # taken, but a later fault was not in it: send again
            self._stale.discard(id(report))
            report.retry.next_at = None
            return None
        if code == Code.OK:
            if report.retry.attempts > 1 and not report.kind.lossy:
                log.info("%s taken after %d attempts", report.what, report.retry.attempts)
            return Settled(report, True, "", answer)
        if report.kind.settles(code, error):
            return Settled(report, False, error or f"answered {code}: {status.info if status else ''}", answer)
        decision = report.retry.answered(code, now, error)
        report.resync = (decision.reinit, decision.reregister)
        log.warning("%s not taken: %s; re-sending in %.1fs%s", report.what, decision.why, decision.delay,
                    " after re-registering" if decision.reregister else "")
        return None

    def _send(self, report: Report, now: float) -> None:
        client = self._client()
        if client is None:
            self._not_sent(report, now, "no controller")
            return
        reinit, reregister = report.resync
        report.resync = (False, False)
        try:
            if reinit or reregister:
                client.resync(reinit=reinit, timeout=RESYNC_TIMEOUT)
            report.call = client.start_report(report.kind.method, report.build(client, report),
                                              timeout=report.retry.attempt_timeout(now), on_done=self._wake)
        except FencedError as exc:  # a re-Register refused with 411: see _read
            report.call, report.retry.deadline = None, now
            self.fenced = self.fenced or str(exc)
            return
        except RecoverClientError as exc:
            report.call = None
            self._not_sent(report, now, str(exc))
            return
        except ValueError as exc:  # BadArgument: no controller could take it, now or later: it settles at once
            report.call = None
            report.retry.deadline = now
            log.error("%s not sent, invalid arguments: %s", report.what, exc)
            return
        report.retry.sent()

    @staticmethod
    def _not_sent(report: Report, now: float, why: str) -> None:
        decision = report.retry.answered(None, now, why)
        if not report.kind.resend:  # one attempt only: it settles on the next poll
            report.retry.deadline = now
        elif why != "no controller":
            log.warning("%s not sent: %s; again in %.1fs", report.what, decision.why, decision.delay)

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> list[Settled]:
        """The agent's last moments: wait (bounded) for the reports still pending, then drop the rest."""
        end = self._clock() + timeout
        settled: list[Settled] = []
        while len(self) and self._clock() < end:
            settled += self.poll(self._clock())
            if len(self):
                time.sleep(0.01)  # the loop is over: nothing else to do here but wait for the answer
        for report in (*self._queue, *self._side):
            if report.call is not None:
                report.call.cancel()
            settled.append(self._settle(Settled(report, False, "the agent is ending")))
        self._queue.clear()
        self._side.clear()
        return settled


class Reporter:
    """Every report the agent sends, past the same checks (a controller, not fenced, not a standby), into one
    outbox. A no-op where no report can be sent: each method says whether it queued one."""

    def __init__(self, client: Callable[[], RecoverClient | None], fencing: Fencing, controller_timeout: float,
                 wake: Callable[[], None]) -> None:
        self._client = client
        self._fencing = fencing
        self._timeout = controller_timeout
        self.outbox = Outbox(client, wake)
        self._settled_faults: list[Settled] = []
        self._finish: Report | None = None  # this node's finish report, once the job ended here
        self._finish_thread: threading.Thread | None = None
        self.handed_over = False  # a node migration moved this node's ranks to another agent: no finish to report

    def refused(self) -> str:
        """Why no report can be sent now ("" when one can)."""
        mgr = self._client()
        if mgr is None:
            return "no controller"
        if self._fencing.fenced is not None:
            return "fenced"
        return "a standby" if mgr.info.standby else ""  # the controller's view: no node, no ranks to report on

    def add(self, kind: ReportKind, build: Callable[[RecoverClient, Report], Any], now: float,
            faults: FaultRanks | None = None, detail: str = "", call: float = ATTEMPT_TIMEOUT,
            standby: bool = False) -> Report | None:
        """Queue one report (its first attempt goes at once); None when none can be sent (``standby``: a standby
        may send it, a node migration's successor)."""
        report = None
        why = self.refused()
        if not why or (standby and why == "a standby"):
            report = Report(kind, build, ReportRetry(now + kind.budget(self._timeout, call)), dict(faults or {}),
                            detail)
            self.outbox.add(report)
        self.poll(now)
        return report

    def poll(self, now: float) -> list[Settled]:
        """Answers read, re-sends started, reports past their deadline settled. A fault report's settling is the
        caller's to act on (not taken: degraded mode); the others' failures are logged, and the round's own timers
        (the controller's deadlines, the agent's loss timer) decide what happens next."""
        settled = self.outbox.poll(now)
        if self.outbox.fenced is not None:  # a report answered 411: this agent was declared lost and replaced
            self._fencing.fence(self.outbox.fenced)
        for s in settled:
            if not s.taken and s.report.kind not in (FAULT, PACE):  # a pace report's watch says why
                log.warning("%s not taken by the controller: %s", s.report.what, s.why)
        self._settled_faults.extend(s for s in settled if s.report.kind is FAULT)
        return settled

    def settled_faults(self) -> list[Settled]:
        """Fault reports settled since last asked (taken, or not within the controller timeout)."""
        out, self._settled_faults = self._settled_faults, []
        return out

    def wake_at(self) -> float | None:
        """When the loop must poll the outbox next (an answer wakes it itself)."""
        return self.outbox.wake_at()

    @property
    def fault_pending(self) -> bool:
        """A fault report the controller has not taken yet."""
        return self.outbox.fault() is not None

    def fault(self, faults: FaultRanks, detail: str, now: float) -> None:
        """Report a fault, or add it to the fault report still pending; `poll` says how it went."""
        if self.refused() or self.outbox.join_fault(faults, detail):
            return
        self.add(FAULT, lambda c, r: c.process_fault_request(r.faults, r.detail), now, faults, detail)

    def stop_complete(self, faults: FaultRanks) -> None:
        self.add(STOP_COMPLETE, lambda c, _r: c.stop_complete_request(Code.OK, "", faults), time.monotonic())

    def strategies(self, faults: FaultRanks, offered: list[str]) -> None:
        """What this node offers for the round."""
        self.add(STRATEGIES, lambda c, _r: c.recover_strategy_request(faults, offered), time.monotonic())

    def status(self, code: int, msg: str, faults: FaultRanks, strategy: str, rejoined: bool = False) -> None:
        self.add(STATUS, lambda c, _r: c.recover_status_request(code, msg, faults, strategy, rejoined=rejoined),
                 time.monotonic())

    def resumed(self, round_: int, seconds: float, at: float, unseen: bool = False,
                clock: Callable[[], float] = time.monotonic, restores: tuple[Any, ...] = ()) -> bool:
        """This node's ranks train again (`seconds` after the round's stop, at monotonic `at`); each attempt says
        how long ago, so that one re-sent through a controller outage is not counted late (issue 17), and where the
        restarted ranks restored from (issue 33)."""
        now = clock()
        if unseen:
            seconds, at = 0.0, now

        def build(client: RecoverClient, _report: Report) -> Any:
            return resumed_request(client, round_, seconds, max(0.0, clock() - at), unseen, restores)

        return self.add(RESUMED, build, now) is not None

    def migration(self, **fields: Any) -> bool:
        """How a planned migration of a rank of this node ended (ranks/migration.py; taskd.v1 `ReportMigration`)."""
        return self.add(MIGRATION, lambda c, _r: migration_request(c, **fields), time.monotonic(),
                        standby=True) is not None

    def restarts(self, restarts: int) -> None:
        """The job's restarts counted here (degraded mode's local restarts): every later Register carries the count
        (the client re-registers with it when the controller is back), and one is sent now (the controller may be
        up: degraded mode only means it did not take a fault report in time)."""
        mgr = self._client()
        if mgr is None or self.refused():
            return
        for info in (mgr.info, mgr.registered_with):
            if info is not None:
                info.restartsUsed = restarts
        self.add(RESTARTS, lambda c, _r: c.registered_with or c.info, time.monotonic())

    def pace(self, factor: float, paces: list[tuple[int, float, int]], timeout: float) -> Report | None:
        """One pace report (agent/watches/stragglers.py): its `outcome` holds the controller's verdicts once settled."""
        return self.add(PACE, lambda c, _r: pace_request(c, factor, paces), time.monotonic(), call=timeout)

    def finished(self, exit_code: int, reason: str) -> None:
        """Every local rank ended: after the round's reports (flushed, bounded), the finish report, polled from a
        thread of its own until taken or its deadline (`wait_finished`). A node whose finish the controller never
        hears of is, after --agent-loss-timeout, a lost node: the controller would end the healthy nodes' job."""
        if self._finish is not None or self.refused() or self.handed_over:
            return
        self.outbox.drop(PACE)  # the ranks ended: their pace is moot
        self.poll(time.monotonic())
        self.outbox.flush()  # the round's reports before the finish
        self._finish = self.add(FINISH, lambda c, _r: c.finish_request(exit_code, reason), time.monotonic())
        if self._finish is not None:
            self._finish_thread = threading.Thread(target=self._deliver_finish, args=(self._finish,),
                                                   name="taskd-finish", daemon=True)
            self._finish_thread.start()

    def _deliver_finish(self, report: Report) -> None:
        self.outbox.flush(max(0.0, report.retry.deadline - time.monotonic()) + 0.1)
        outcome = report.outcome
        if outcome is not None and outcome.taken:
            if report.retry.attempts > 1:
                log.info("the controller acknowledged this node's finish after %d attempts", report.retry.attempts)
        else:
            log.warning("the controller did not take this node's finish report: %s; it may count this node as lost",
                        outcome.why if outcome is not None else "not sent")

    def wait_finished(self) -> None:
        """Wait for the finish report, to its deadline."""
        if self._finish_thread is not None and self._finish is not None:
            self._finish_thread.join(max(0.0, self._finish.retry.deadline - time.monotonic()) + 1.0)


__all__ = ["FLUSH_TIMEOUT", "RESYNC_TIMEOUT", "Outbox", "Report", "Reporter", "Settled"]
