"""The controller's core: jobs in memory, every handled event committed, signals fanned out.

It glues the pure `JobMachine`s to the `Store`, the `SignalHub` and one deadline timer for
all jobs. Everything runs on the server's event loop thread, so handling one event (state
change + SQLite commit + queueing signals) is atomic with respect to other requests.

An event whose only effect is soft history (an agent's stream opened or closed, nothing a
restart restores and nothing anybody is answered 0 for) is not committed on its own: it is
batched and written with the job's next commit, or within `soft_flush_delay`, in one transaction
for all jobs. 10,000 agents subscribing cost a few transactions, not 10,000.

A finished job (SUCCEEDED or FAILED) is evicted, from memory and from the store, once no agent has
streamed or called for it for `finished_job_retention` seconds, and a job no agent registered for
once `unregistered_job_timeout` has passed; when the table is full an agentless job goes first, then
the finished job idle the longest. A long-running server serving many short jobs never fills up, and
only a table full of live jobs refuses a new one.

A change the store cannot take (`StoreError`: a full disk, an I/O error) is undone in memory too
(`Checkpoint`) and answered `STORAGE_ERROR` with its cause; nobody is signalled for it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from taskd.controller.clock import Clock
from taskd.controller.machine.events import AgentConnected, Event, JobInit, Outcome, Record, Signal
from taskd.controller.machine.model import TERMINAL, MachineConfig
from taskd.controller.machine.state_machine import JobMachine
from taskd.controller.nodes.node_loss import fence_refusal
from taskd.controller.service.hub import SignalHub, Subscriber, to_wire
from taskd.controller.storage.checkpoint import Checkpoint
from taskd.controller.storage.group_commit import GroupCommit
from taskd.controller.storage.job_record import job_record
from taskd.controller.storage.quota import JobLimits
from taskd.controller.storage.store import Store, StoreError
from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Code, SignalType

if TYPE_CHECKING:
    from taskd.controller.metrics import ControllerMetrics

log = logging.getLogger(__name__)

SOFT_KINDS = frozenset({"agent_subscribed", "agent_unsubscribed"})
"""History records of soft state: batched instead of committed one transaction each."""

UNLOGGED_KINDS = SOFT_KINDS | {"stop_complete", "strategies_reported", "recover_status"}
"""One per agent per phase: in the history, not in the log (10,000 agents would flood it)."""

STORE_RETRY = 1.0
"""After a timer event of a job could not be stored, its timer waits this long before trying again."""


class _SoftBatch:
    __slots__ = ("job", "records", "agents")

    def __init__(self, job: JobMachine) -> None:
        self.job = job
        self.records: list[tuple[Record, float]] = []
        self.agents: set[int] = set()


class ControllerCore:
    def __init__(self, config: MachineConfig, store: Store, hub: SignalHub, max_jobs: int = 10000,
                 clock: Callable[[], float] = time.monotonic, soft_flush_delay: float = 0.2,
                 finished_job_retention: float = 3600.0, wall: Callable[[], float] = time.time,
                 max_job_bytes: int = 0, job_log_lines: int = 0) -> None:
        self.config = config
        self.store = store
        self.hub = hub
        self.max_jobs = max_jobs
        self.on_settled: Callable[[Any], None] | None = None  # the waiting `Migrate` calls (service/servicers.py)
        # every deadline and duration on `clock` (monotonic), what is stored and shown in `wall` time
        # (taskd.controller.clock); the machines only ever see `clock`
        self.clock = clock
        self.clocks = Clock(clock, wall)
        self.finished_job_retention = finished_job_retention
        self.jobs: dict[str, JobMachine] = {}
        # finished jobs -> time of their last activity, least recently active first (eviction order)
        self._finished: dict[str, float] = {}
        # jobs without any agent (an Init no Register followed) -> since when; dropped after unregistered_job_timeout
        self._agentless: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}  # jobs whose last timer event could not be stored -> retry time
        self._heap: list[tuple[float, str]] = []
        self._pushed: dict[str, float] = {}  # the earliest heap entry of each job that has one
        self._next_wake = math.inf
        self._wake = asyncio.Event()
        self.soft_flush_delay = soft_flush_delay
        self.soft_batches: dict[str, _SoftBatch] = {}
        self._soft_timer: asyncio.TimerHandle | None = None
        self.closing = False  # set by the server's stop(): closing streams are not recorded one by one
        self.metrics: ControllerMetrics | None = None  # counts what each stored change records (metrics.py)
        self.group = GroupCommit(self)  # the agents' reports, committed together per loop turn
        self.limits = JobLimits(max_job_bytes, job_log_lines, store.snapshot_bytes)  # quota.py: bytes, log lines

    # ------------------------------------------------------------------ events

    def load(self) -> int:
        """Bring persisted jobs back; jobs caught mid-round wait for their agents (RESUMING)."""
        now = self.clock()
        self.limits.quota.used = self.store.job_bytes()
        for snap, agents in self.store.load_jobs():  # rows that break stored_rows' rules are left out, said so
            try:
                m, out = JobMachine.restore(snap, agents, self.config, now, self.clocks.from_wall)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # what the rules missed
                log.error("state file %s: job %r not loaded: its snapshot does not restore (%s: %s); the other jobs "
                          "load", self.store.path, snap.get("job_id"), type(exc).__name__, exc)
                continue
            self.jobs[m.job_id] = m
            self._store(m, out, now)
            self._publish(m, out)
            # a restart does not reset a finished job's retention: it was last active before it
            self._touch(m, max([m.updated_at, *(a.last_seen for a in m.agents.values())]))
            log.info("loaded job %s (%s)", m.job_id, m.state.value)
        if self._finished:  # restored in creation order; eviction goes by last activity
            self._finished = dict(sorted(self._finished.items(), key=lambda item: item[1]))
        return len(self.jobs)

    def init_job(self, job_id: str, ev: JobInit) -> Outcome:
        self.group.flush()
        m = self.jobs.get(job_id)
        if m is not None:
            return self.dispatch(job_id, ev)
        try:
            if len(self.jobs) >= self.max_jobs and not self._evict_one_for(job_id):
                return Outcome(code=Code.TOO_MANY_JOBS, info=self._full_info())
        except StoreError as exc:
            return self._store_failed(job_id, ev, exc)
        now = self.clock()
        m = JobMachine(job_id, self.config, now, ev)
        out = Outcome(info=f"job {job_id} created")
        self.limits.forget(job_id)
        out.records.append(Record("job_created", 0, {"node_count": m.node_count, "ranks_per_node": m.ranks_per_node,
                                                      "max_restarts": m.max_restarts, "policy": list(m.policy),
                                                      "host": ev.host, "pid": ev.pid}))
        try:
            self._store(m, out, now)
        except StoreError as exc:
            return self._store_failed(job_id, ev, exc)  # never held: nothing to undo
        self.jobs[job_id] = m
        self._publish(m, out)
        self._touch(m, now)
        return out

    def dispatch(self, job_id: str, event: Event, reply_to: Subscriber | None = None) -> Outcome:
        """Handle `event`, store what it changed, then tell the agents. A change that cannot be stored is
        undone in memory too (answered `STORAGE_ERROR` with the cause); nobody hears of it."""
        self.group.flush()  # the job's reports still pending go to the file first, in order
        m = self.jobs.get(job_id)
        if m is None:
            return Outcome(code=Code.JOB_NOT_EXIST, info=f"job {job_id} does not exist (call Init first)")
        now = self.clock()
        saved = Checkpoint(m, getattr(event, "node_rank", None))
        try:
            out = m.handle(event, now)
            if (refused := self.limits.refused(job_id, event, out)) is not None:
                self.undo(m, saved)
                return refused
            self._store(m, out, now)
        except StoreError as exc:
            self.undo(m, saved)
            if reply_to is not None:  # a stream its agent believes counted, while the job says it is not open:
                reply_to.close(f"not stored: {exc}")  # end it, and the agent subscribes again
            return self.not_stored(m, event, exc, now)
        except Exception:
            self.undo(m, saved)  # a bug in a handler must not leave half an event behind
            raise
        self.stored(m, out, now, reply_to)
        return out

    def stored(self, m: JobMachine, out: Outcome, now: float, reply_to: Subscriber | None = None) -> None:
        """What follows a change once it is on disk: its signals, its log lines, the job's timer."""
        self._retry_at.pop(m.job_id, None)
        if out.settled is not None and self.on_settled is not None:  # a migration's end: its `Migrate` call answered
            self.on_settled(out.settled)
        self._publish(m, out, reply_to)
        self._touch(m, now)

    def not_stored(self, m: JobMachine, event: Event, exc: StoreError, now: float) -> Outcome:
        """The answer to a change the store refused (memory already undone); its job's timer waits too."""
        self._retry_at[m.job_id] = now + STORE_RETRY  # instead of spinning on the disk
        self._schedule(m)
        return self._store_failed(m.job_id, event, exc)

    def _store(self, m: JobMachine, out: Outcome, now: float) -> None:
        """Commit what `out` changed (soft history is batched instead); raises StoreError."""
        if not (out.records or out.agents_changed):
            return
        if not out.signals and all(rec.kind in SOFT_KINDS for rec in out.records):
            self._defer_soft(m, out, now)
            return
        soft = self.soft_batches.pop(m.job_id, None)
        changed = out.agents_changed | soft.agents if soft else out.agents_changed
        to_wall = self.clocks.frozen()
        try:
            self.store.commit(m, out.records, changed, to_wall(now), earlier=soft.records if soft else (),
                              to_wall=to_wall)
        except StoreError:
            if soft is not None:
                self.soft_batches[m.job_id] = soft  # still to be written
            raise

    def _publish(self, m: JobMachine, out: Outcome, reply_to: Subscriber | None = None) -> None:
        """What a stored change tells: the log, the broadcast signals, the caller's own signals."""
        if self.metrics is not None:
            self.metrics.observe(out.records)
        self.limits.stored(m.job_id, out, UNLOGGED_KINDS, SOFT_KINDS)  # charged to its quota, logged rate-limited
        if out.signals:
            self.hub.post(m.job_id, out.signals)  # at the end of this loop turn, merged stopTrains coalesced
        if reply_to is not None and out.direct:
            self.hub.flush(m.job_id)  # keep the order: what the job broadcast before goes first
            for sig in out.direct:
                reply_to.offer(to_wire(m.job_id, sig))
        for key, sig in out.to_standbys:  # a standby's own: taskd.assignNode, its exit, or its stream closed
            if not self.hub.to_standby(m.job_id, key, None if sig is None else to_wire(m.job_id, sig)) and sig:
                log.info("job %s: standby %s:%d has no stream open for its %s", m.job_id, *key, sig.signal_type)
        self._schedule(m)

    def undo(self, m: JobMachine, saved: Checkpoint) -> None:
        """Put the job back as it was before the event `saved` was taken for."""
        if saved.restore():
            return
        # only a handler changing a per-agent container in place, away from the event's node, gets here
        log.error("job %s: memory could not be rolled back exactly; reloading it from the state file", m.job_id)
        self._reload(m.job_id)

    def _reload(self, job_id: str) -> None:
        """Replace the job in memory with what the store holds; the agents whose stream is open stay subscribed."""
        now = self.clock()
        for snap, agents in self.store.load_jobs(job_id):
            m, out = JobMachine.restore(snap, agents, self.config, now, self.clocks.from_wall)
            for n, a in m.agents.items():
                if self.hub.has(job_id, n):
                    m.agents.set_online(a, True)
                    m.agents.set_subscribed(a, True)
                    m.agents.set_gone(a, None)  # its stream is open here
            m.standbys = {k: replace(s, subscribed=True, gone_since=None) if self.hub.has_standby(job_id, k) else s
                          for k, s in m.standbys.items()}
            self.jobs[job_id] = m
            self.soft_batches.pop(job_id, None)
            try:
                self._store(m, out, now)
            except StoreError as exc:
                log.error("job %s reloaded, its resumption not stored: %s", job_id, exc)
            self._schedule(m)
            return
        self.jobs.pop(job_id, None)
        self._finished.pop(job_id, None)
        self._agentless.pop(job_id, None)

    def _store_failed(self, job_id: str, event: Event, exc: StoreError) -> Outcome:
        log.error("job %s: %s not stored, so not applied: %s", job_id, type(event).__name__, exc)
        if self.metrics is not None:
            self.metrics.store_failed()
        return Outcome(code=Code.STORAGE_ERROR,
                       info=f"{exc}; nothing changed (job {job_id} is as before), send it again later")

    # ------------------------------------------------------------------ soft history, batched

    def _defer_soft(self, m: JobMachine, out: Outcome, now: float) -> None:
        if not self.limits.keeps_soft(m.job_id):
            return  # past its quota: a job's stream history is dropped, not written (quota.py)
        batch = self.soft_batches.get(m.job_id)
        if batch is None or batch.job is not m:
            batch = self.soft_batches[m.job_id] = _SoftBatch(m)
        wall = self.clocks.to_wall(now)
        batch.records.extend((rec, wall) for rec in out.records)
        batch.agents.update(out.agents_changed)
        if self._soft_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): write now
                self.flush_soft()
                return
            self._soft_timer = loop.call_later(self.soft_flush_delay, self._flush_soft_timer)

    def _flush_soft_timer(self) -> None:
        self._soft_timer = None
        try:
            self.flush_soft()
        except Exception:  # e.g. the store closed during shutdown; the history is soft
            log.exception("could not write the batched stream history")

    def flush_soft(self) -> None:
        """Write every batched soft record now, in one transaction (lost, with one line, if that fails:
        streams opening and closing are nothing a restart needs)."""
        if self._soft_timer is not None:
            self._soft_timer.cancel()
            self._soft_timer = None
        if not self.soft_batches:
            return
        batches, self.soft_batches = list(self.soft_batches.values()), {}
        try:
            self.store.commit_soft(((b.job, b.records, b.agents) for b in batches), to_wall=self.clocks.frozen())
        except StoreError as exc:
            log.error("stream history of %d job(s) not written: %s", len(batches), exc)

    # ------------------------------------------------------------------ eviction of finished and agentless jobs

    def _touch(self, m: JobMachine, when: float) -> None:
        """Note activity on the job: a finished one moves to the back of the eviction order; one without any
        agent keeps the time it lost (or never had) its last agent, so calling Init again does not keep it."""
        self._finished.pop(m.job_id, None)
        if m.state in TERMINAL:
            self._finished[m.job_id] = when
        if len(m.agents) or m.standbys:  # a job its standbys wait on is not agentless
            self._agentless.pop(m.job_id, None)
        else:
            self._agentless.setdefault(m.job_id, when)

    def evict_expired(self) -> list[str]:
        """Evict every finished job idle (no stream, no call) for `finished_job_retention` seconds, and every
        job that has had no agent for `unregistered_job_timeout` seconds (an Init no Register followed)."""
        self.group.flush()  # a report still pending is activity: decide on what is committed
        now = self.clock()
        limit = now - self.finished_job_retention
        expired = []
        for job_id, last in self._finished.items():
            if last > limit:
                break  # the rest were active later
            if self.hub.count(job_id) == 0:
                expired.append(job_id)
        if expired:
            self._evict(expired, f"finished and idle for {self.finished_job_retention:g}s")
        timeout = self.config.unregistered_job_timeout
        unregistered = [job_id for job_id, since in self._agentless.items()
                        if since <= now - timeout and self.hub.count(job_id) == 0]
        if unregistered:
            self._evict(unregistered, f"no agent registered within {timeout:g}s of its Init")
        return expired + unregistered

    def _evict_one_for(self, new_job: str) -> bool:
        """The table is full: make room for `new_job` by evicting the job without agents held the longest
        (it holds nothing anybody would miss), else the finished job idle the longest."""
        for candidates, why in ((self._agentless, "has no agent"), (self._finished, "finished")):
            oldest = next((job_id for job_id in candidates if self.hub.count(job_id) == 0), None)
            if oldest is not None:
                self._evict([oldest], f"{why}, the job table is full ({self.max_jobs}) and job {new_job} "
                                      "needs a place")
                return True
        return False

    def _evict(self, job_ids: list[str], why: str) -> None:
        self.group.flush()
        # from the store first: a job still in memory but gone from disk would only be missing after a restart
        self.store.delete_jobs(job_ids)
        for job_id in job_ids:
            m = self.jobs.pop(job_id)
            self._finished.pop(job_id, None)
            self._agentless.pop(job_id, None)
            self._retry_at.pop(job_id, None)
            self.soft_batches.pop(job_id, None)
            self._pushed.pop(job_id, None)
            self.limits.forget(job_id)
            log.info("job %s (%s) evicted: %s", job_id, m.state.value, why)

    def _full_info(self) -> str:
        live = len(self.jobs) - len(self._finished)
        waiting = len(self._finished)
        info = f"too many jobs: {live} of the limit of {self.max_jobs} are still running"
        if waiting:
            info += f" and {waiting} finished one(s) still have agents connected"
        return (info + "; wait for a job to end (a finished job is evicted once its agents disconnect) or "
                "restart `taskd server` with a higher --max-jobs")

    async def run_eviction(self, interval: float | None = None) -> None:
        """Evict expired jobs every `interval` s (default: a quarter of the shorter of the finished-job
        retention and the unregistered-job timeout, 0.1-60 s)."""
        if interval is None:
            shortest = min(self.finished_job_retention, self.config.unregistered_job_timeout)
            interval = min(max(shortest / 4, 0.1), 60.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.evict_expired()
            except StoreError as exc:  # e.g. a full disk: the jobs stay, the next sweep tries again
                log.error("could not evict jobs: %s", exc)
            except Exception:
                log.exception("could not evict jobs")

    # ------------------------------------------------------------------ the one timer

    def _schedule(self, m: JobMachine) -> None:
        """Make sure the timer fires no later than the job's `wake_at`. A job has an entry only when
        it needs an earlier one: an entry that fires early finds nothing due and reschedules."""
        wake_at = m.wake_at
        if wake_at is None:
            return
        retry = self._retry_at.get(m.job_id)
        if retry is not None and retry > wake_at:
            wake_at = retry  # its last timer event could not be stored: not before the retry time
        pushed = self._pushed.get(m.job_id)
        if pushed is not None and pushed <= wake_at:
            return
        self._pushed[m.job_id] = wake_at
        heapq.heappush(self._heap, (wake_at, m.job_id))
        if wake_at < self._next_wake:
            self._wake.set()

    def fire_due(self) -> None:
        """Deliver the timer events (a round deadline, an agent's loss) of every job that is due."""
        now = self.clock()
        due: list[str] = []
        early: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            t, job_id = heapq.heappop(self._heap)
            if self._pushed.get(job_id) == t:
                del self._pushed[job_id]
            m = self.jobs.get(job_id)
            if m is None or job_id in due:
                continue
            if m.wake_at is None or m.wake_at > now or self._retry_at.get(job_id, now) > now:
                early.append(job_id)  # its time moved on since this entry was pushed
                continue
            due.append(job_id)
        for job_id in due:
            for event in self.jobs[job_id].due_events(now):
                self.dispatch(job_id, event)
        for job_id in early:
            self._schedule(self.jobs[job_id])

    async def run_timer(self) -> None:
        """Deliver the timer events of every job that is due; sleeps until the earliest one."""
        while True:
            try:
                self.fire_due()
            except Exception:  # a bug in one job must not stop every job's timer
                log.exception("deadline handling failed")
            self._next_wake = self._heap[0][0] if self._heap else math.inf
            self._wake.clear()
            delay = min(max(self._next_wake - self.clock(), 0.0), 60.0)
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ read-only view

    def fenced(self, job_id: str, node_rank: int, host: str, pid: int) -> bytes | None:
        """The one `taskd.fenced` signal a subscription from a fenced identity gets before its stream ends
        (None: not fenced)."""
        m = self.jobs.get(job_id)
        why = fence_refusal(m, AgentConnected(node_rank=node_rank, host=host, pid=pid), self.clock()) if m else ""
        if m is None or not why:
            return None
        log.warning("job %s: refused the stream of fenced agent %s:%d of node %d", job_id, host, pid, node_rank)
        # not one of the job's numbered signals: the job does not change for a refused stream
        sig = Signal(uuid=f"{m.job_id}-fenced-{uuid.uuid4().hex[:12]}", signal_type=SignalType.FENCED, actions=(),
                     reason=why, nodes=(node_rank,))
        return to_wire(m.job_id, sig)

    def holder_refusal(self, job_id: str, node_rank: int, host: str, pid: int) -> str:
        """Why a Register or a subscription from (`host`, `pid`) may not take the node ("" if it may): its
        agent is live and another process (`Job.holder`). A subscription is checked before it replaces a stream."""
        m = self.jobs.get(job_id)
        return m.holder_refusal(node_rank, host, pid, self.clock()) if m is not None else ""

    def job_list(self, job_id: str = "") -> taskd_pb2.JobList:
        self.group.flush()  # nothing shown that is not on disk yet
        self.flush_soft()  # the history shown includes the latest streams opened and closed
        if job_id and job_id not in self.jobs:
            info = (f"job {job_id} does not exist: unknown here (never created, finished and evicted after "
                    f"{self.finished_job_retention:g}s without activity (--finished-job-retention), or no agent "
                    f"registered within {self.config.unregistered_job_timeout:g}s of its Init)")
            return taskd_pb2.JobList(status=recover_pb2.Status(code=Code.JOB_NOT_EXIST, info=info))
        jobs = [self.jobs[job_id]] if job_id else sorted(self.jobs.values(), key=lambda j: j.created_at)
        try:
            records = [job_record(m, self.store, self.hub, self.clocks) for m in jobs]
        except sqlite3.Error as exc:  # the history is read from the state file
            log.error("could not read the job history from %s: %s", self.store.path, exc)
            info = f"cannot read the controller's state file {self.store.path}: {exc}"
            return taskd_pb2.JobList(status=recover_pb2.Status(code=Code.STORAGE_ERROR, info=info))
        return taskd_pb2.JobList(status=recover_pb2.Status(code=Code.OK), jobs=records)
