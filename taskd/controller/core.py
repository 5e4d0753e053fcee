"""The controller's core: jobs in memory, every handled event committed, signals fanned out.

It glues the pure `JobMachine`s to the `Store`, the `SignalHub` and one deadline timer for
all jobs. Everything runs on the server's event loop thread, so handling one event (state
change + SQLite commit + queueing signals) is atomic with respect to other requests.

An event whose only effect is soft history (an agent's stream opened or closed, nothing a
restart restores and nothing anybody is answered 0 for) is not committed on its own: it is
batched and written with the job's next commit, or within `soft_flush_delay`, in one transaction
for all jobs. 10,000 agents subscribing cost a few transactions, not 10,000.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import math
import time
from collections.abc import Callable

from taskd.controller.hub import SignalHub, Subscriber, to_wire
from taskd.controller.state_machine import Event, JobInit, JobMachine, MachineConfig, Outcome, Record
from taskd.controller.store import Store
from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Code

log = logging.getLogger(__name__)

SOFT_KINDS = frozenset({"agent_subscribed", "agent_unsubscribed"})
"""History records of soft state: batched instead of committed one transaction each."""

UNLOGGED_KINDS = SOFT_KINDS | {"stop_complete", "strategies_reported", "recover_status"}
"""One per agent per phase: in the history, not in the log (10,000 agents would flood it)."""


class _SoftBatch:
    __slots__ = ("job", "records", "agents")

    def __init__(self, job: JobMachine) -> None:
        self.job = job
        self.records: list[tuple[Record, float]] = []
        self.agents: set[int] = set()


class ControllerCore:
    def __init__(self, config: MachineConfig, store: Store, hub: SignalHub, max_jobs: int = 10000,
                 clock: Callable[[], float] = time.time, soft_flush_delay: float = 0.2) -> None:
        self.config = config
        self.store = store
        self.hub = hub
        self.max_jobs = max_jobs
        self.clock = clock
        self.jobs: dict[str, JobMachine] = {}
        self._heap: list[tuple[float, str]] = []
        self._pushed: dict[str, float] = {}  # the earliest heap entry of each job that has one
        self._next_wake = math.inf
        self._wake = asyncio.Event()
        self.soft_flush_delay = soft_flush_delay
        self._soft: dict[str, _SoftBatch] = {}
        self._soft_timer: asyncio.TimerHandle | None = None
        self.closing = False  # set by the server's stop(): closing streams are not recorded one by one

    # ------------------------------------------------------------------ events

    def load(self) -> int:
        """Bring persisted jobs back; jobs caught mid-round wait for their agents (RESUMING)."""
        now = self.clock()
        for snap, agents in self.store.load_jobs():
            m, out = JobMachine.restore(snap, agents, self.config, now)
            self.jobs[m.job_id] = m
            self._finish(m, out, now)
            log.info("loaded job %s (%s)", m.job_id, m.state.value)
        return len(self.jobs)

    def init_job(self, job_id: str, ev: JobInit) -> Outcome:
        m = self.jobs.get(job_id)
        if m is not None:
            return self.dispatch(job_id, ev)
        if len(self.jobs) >= self.max_jobs:
            return Outcome(code=Code.TOO_MANY_JOBS, info=f"too many jobs ({len(self.jobs)}); limit {self.max_jobs}")
        now = self.clock()
        m = JobMachine(job_id, self.config, now, ev)
        self.jobs[job_id] = m
        out = Outcome(info=f"job {job_id} created")
        out.records.append(Record("job_created", 0, {"node_count": m.node_count, "ranks_per_node": m.ranks_per_node,
                                                      "max_restarts": m.max_restarts, "policy": list(m.policy),
                                                      "host": ev.host, "pid": ev.pid}))
        self._finish(m, out, now)
        return out

    def dispatch(self, job_id: str, event: Event, reply_to: Subscriber | None = None) -> Outcome:
        m = self.jobs.get(job_id)
        if m is None:
            return Outcome(code=Code.JOB_NOT_EXIST, info=f"job {job_id} does not exist (call Init first)")
        now = self.clock()
        out = m.handle(event, now)
        self._finish(m, out, now, reply_to)
        return out

    def _finish(self, m: JobMachine, out: Outcome, now: float, reply_to: Subscriber | None = None) -> None:
        if out.records or out.agents_changed:
            if not out.signals and all(rec.kind in SOFT_KINDS for rec in out.records):
                self._defer_soft(m, out, now)
            else:
                soft = self._soft.pop(m.job_id, None)
                changed = out.agents_changed | soft.agents if soft else out.agents_changed
                # before anyone hears of it
                self.store.commit(m, out.records, changed, now, earlier=soft.records if soft else ())
        for rec in out.records:
            if rec.kind not in UNLOGGED_KINDS:
                log.info("job %s round %d: %s %s", m.job_id, rec.round, rec.kind, json.dumps(rec.detail))
        if out.signals:
            self.hub.post(m.job_id, out.signals)  # at the end of this loop turn, merged stopTrains coalesced
        if reply_to is not None and out.direct:
            self.hub.flush(m.job_id)  # keep the order: what the job broadcast before goes first
            for sig in out.direct:
                reply_to.offer(to_wire(m.job_id, sig))
        self._schedule(m)

    # ------------------------------------------------------------------ soft history, batched

    def _defer_soft(self, m: JobMachine, out: Outcome, now: float) -> None:
        batch = self._soft.get(m.job_id)
        if batch is None or batch.job is not m:
            batch = self._soft[m.job_id] = _SoftBatch(m)
        batch.records.extend((rec, now) for rec in out.records)
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
        """Write every batched soft record now, in one transaction."""
        if self._soft_timer is not None:
            self._soft_timer.cancel()
            self._soft_timer = None
        if not self._soft:
            return
        batches, self._soft = list(self._soft.values()), {}
        self.store.commit_soft((b.job, b.records, b.agents) for b in batches)

    # ------------------------------------------------------------------ the one timer

    def _schedule(self, m: JobMachine) -> None:
        """Make sure the timer fires no later than the job's `wake_at`. A job has an entry only when
        it needs an earlier one: an entry that fires early finds nothing due and reschedules."""
        wake_at = m.wake_at
        if wake_at is None:
            return
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
            if m.wake_at is None or m.wake_at > now:
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

    def job_list(self, job_id: str = "") -> taskd_pb2.JobList:
        self.flush_soft()  # the history shown includes the latest streams opened and closed
        if job_id and job_id not in self.jobs:
            return taskd_pb2.JobList(status=recover_pb2.Status(code=Code.JOB_NOT_EXIST,
                                                               info=f"job {job_id} does not exist"))
        jobs = [self.jobs[job_id]] if job_id else sorted(self.jobs.values(), key=lambda j: j.created_at)
        return taskd_pb2.JobList(status=recover_pb2.Status(code=Code.OK), jobs=[self._job_record(m) for m in jobs])

    def _job_record(self, m: JobMachine) -> taskd_pb2.JobRecord:
        agents = [
            taskd_pb2.AgentRecord(nodeRank=a.node_rank, role=a.role, host=a.host, pid=a.pid,
                                  ranksPerNode=a.ranks_per_node, subscribed=self.hub.has(m.job_id, a.node_rank),
                                  registeredAt=a.registered_at, lastSeen=a.last_seen, finished=a.finished,
                                  exitCode=a.exit_code)
            for a in sorted(m.agents.values(), key=lambda a: a.node_rank)
        ]
        rounds = [
            taskd_pb2.RoundRecord(
                round=r["round"], startedAt=r["started_at"], endedAt=r["ended_at"],
                faultRanks=[recover_pb2.FaultRank(rankId=str(k), faultType=t) for k, t in r["faults"]],
                strategiesTried=r["tried"], strategy=r["strategy"], outcome=r["outcome"],
                durationSeconds=r["duration"],
            )
            for r in self.store.rounds(m.job_id)
        ]
        events = [taskd_pb2.EventRecord(time=e["time"], kind=e["kind"], round=e["round"], detail=e["detail"])
                  for e in self.store.events(m.job_id)]
        return taskd_pb2.JobRecord(
            jobId=m.job_id, state=m.state.value, nodeCount=m.node_count, ranksPerNode=m.ranks_per_node,
            restarts=m.restarts, maxRestarts=m.max_restarts, createdAt=m.created_at, updatedAt=m.updated_at,
            agents=agents, rounds=rounds, events=events, info=m.info,
        )
