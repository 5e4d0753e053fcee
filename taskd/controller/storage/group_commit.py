"""Group commit: the reports handled in one event-loop turn are written in one SQLite transaction.

10,000 jobs faulting at once send 40,000 reports in seconds; one transaction each made the state
file's BEGIN/COMMIT and page writes a large share of the controller's time. The rule stays the one
docs/controller.md states: a change is committed before its request is answered and before any
signal it causes goes out. A report is applied in memory at once (so the next report of the same
job sees it, as before), then waits, answer and signals held, until the transaction holding it
committed; only then is it answered and are its signals published, in the order the reports were
handled. gRPC hands the loop about one request per turn, so a commit per turn would still be a commit
per report: in a burst, a report arriving within `window` (10 ms) of the last commit waits for the next
one, at most `window` later, with everything else that arrived meanwhile; otherwise it is committed at the
end of its own loop turn, without waiting. A burst is more than `burst` (8) reports within the last
`window`, or reports of at least `jobs_burst` (8) different jobs within the last `horizon` (1 s): many jobs
faulting at once send their reports at a rate that, between its peaks, stays under the first threshold
(at 2,000 jobs, 90 % of the transactions held one report by it alone), while each of them waits seconds
behind the others' calls anyway. One job's round is no burst: its reports (fault, stop complete,
strategies) each wait on the answer to the one before, and with the window each waited ~9 ms for nothing
(18 ms of a 30 ms round, BENCHMARKS.md).

If that transaction fails (a full disk, an I/O error) nothing of it is on disk: every report of the
batch is undone in memory, newest first (each `Checkpoint` holds the job as it was before its
report), and answered STORAGE_ERROR; nobody is signalled for any of them. A synchronous change
(`ControllerCore.dispatch`: a stream opening, a timer event, an Init) first commits what is pending,
so a job's changes reach the file in the order they were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from taskd.controller.clock import Clock
from taskd.controller.machine.events import Event, Outcome, Record
from taskd.controller.machine.state_machine import JobMachine
from taskd.controller.storage.checkpoint import Checkpoint
from taskd.controller.storage.quota import JobLimits
from taskd.controller.storage.store import Store, StoreError

log = logging.getLogger(__name__)


class Core(Protocol):
    """What the group commit needs of `ControllerCore` (which owns it: no import back)."""

    jobs: dict[str, JobMachine]
    store: Store
    clocks: Clock
    clock: Callable[[], float]
    soft_batches: dict[str, Any]  # job id -> its batched stream history, written before its next change
    limits: JobLimits  # each job's quota of stored bytes (quota.py)

    def dispatch(self, job_id: str, event: Event) -> Outcome: ...
    def undo(self, m: JobMachine, saved: Checkpoint) -> None: ...
    def stored(self, m: JobMachine, out: Outcome, now: float) -> None: ...
    def not_stored(self, m: JobMachine, event: Event, exc: StoreError, now: float) -> Outcome: ...


class _Pending:
    __slots__ = ("job", "event", "out", "saved", "now", "future")

    def __init__(self, job: JobMachine, event: Event, out: Outcome, saved: Checkpoint, now: float,
                 future: asyncio.Future[Outcome]) -> None:
        self.job = job
        self.event = event
        self.out = out
        self.saved = saved
        self.now = now
        self.future = future


class GroupCommit:
    """The reports applied in memory and not yet committed, in the order they were handled."""

    def __init__(self, core: Core, window: float = 0.01, burst: int = 8, jobs_burst: int = 8,
                 horizon: float = 1.0) -> None:
        self.core = core
        self.window = window
        self.burst = burst
        self.jobs_burst = jobs_burst
        self.horizon = horizon
        self._arrivals: deque[float] = deque()  # loop times of the reports submitted within the last window
        self._jobs: OrderedDict[str, float] = OrderedDict()  # jobs that reported within `horizon`, by last report
        self._pending: list[_Pending] = []
        self._handle: asyncio.Handle | None = None
        self._last_flush = -float("inf")  # loop time of the last commit
        self.transactions = 0  # committed batches
        self.committed = 0  # reports committed in them

    def __len__(self) -> int:
        return len(self._pending)

    async def submit(self, job_id: str, event: Event) -> Outcome:
        """Handle `event` like `ControllerCore.dispatch`; answered once its change is committed with the
        others of this loop turn."""
        core = self.core
        m = core.jobs.get(job_id)
        if m is None:
            return core.dispatch(job_id, event)  # answers JOB_NOT_EXIST
        now = core.clock()
        saved = Checkpoint(m, getattr(event, "node_rank", None))
        try:
            out = m.handle(event, now)
        except Exception:
            core.undo(m, saved)  # a bug in a handler must not leave half an event behind
            raise
        if (refused := core.limits.refused(job_id, event, out)) is not None:  # past the job's quota (quota.py)
            core.undo(m, saved)
            return refused
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(m, event, out, saved, now, future))
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        self._arrivals.append(arrived)
        while self._arrivals[0] < arrived - self.window:
            self._arrivals.popleft()
        jobs = self._jobs
        jobs[job_id] = arrived
        jobs.move_to_end(job_id)
        while next(iter(jobs.values())) < arrived - self.horizon:
            jobs.popitem(last=False)
        if self._handle is None:
            due = self._last_flush + self.window
            # quiet: at the end of this turn; a burst: with what else arrives until `window` after the last commit
            busy = arrived < due and (len(self._arrivals) > self.burst or len(jobs) >= self.jobs_burst)
            self._handle = loop.call_at(due, self.flush) if busy else loop.call_soon(self.flush)
        return await future

    def flush(self) -> None:
        """Commit every pending report in one transaction, then answer each and publish its signals."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        with contextlib.suppress(RuntimeError):  # no loop: a synchronous caller at shutdown
            self._last_flush = asyncio.get_running_loop().time()
        core = self.core
        to_wall = core.clocks.frozen()
        soft = {}
        batch: list[tuple[JobMachine, list[tuple[Record, float]], set[int]]] = []
        for p in pending:
            out = p.out
            if not (out.records or out.agents_changed):
                continue
            job_id = p.job.job_id
            if job_id not in soft:  # the job's batched stream history goes first, to keep the order
                earlier = soft[job_id] = core.soft_batches.pop(job_id, None)
                if earlier is not None:
                    batch.append((p.job, earlier.records, earlier.agents))
            wall = to_wall(p.now)
            batch.append((p.job, [(rec, wall) for rec in out.records], out.agents_changed))
        try:
            if batch:
                core.store.commit_group(batch, to_wall=to_wall)
                self.transactions += 1
                self.committed += len(pending)
        except Exception as exc:  # noqa: BLE001 - any failure: undone and answered, never a report left waiting
            if not isinstance(exc, StoreError):
                log.exception("committing %d report(s) failed", len(pending))
                exc = StoreError(core.store.path, exc)
            for job_id, earlier in soft.items():
                if earlier is not None:
                    core.soft_batches[job_id] = earlier
            for p in reversed(pending):  # newest first: each checkpoint is the job before its own report
                core.undo(p.job, p.saved)
            for p in pending:
                result = core.not_stored(p.job, p.event, exc, p.now)
                if not p.future.done():
                    p.future.set_result(result)
            return
        for p in pending:
            try:
                core.stored(p.job, p.out, p.now)
            except Exception:  # noqa: BLE001 - one job's publishing must not hold up the others' answers
                log.exception("job %s: publishing a stored change failed", p.job.job_id)
            if not p.future.done():
                p.future.set_result(p.out)
