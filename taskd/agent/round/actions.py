"""The round machine's actions carried out: one executor per action type (docs/architecture.md, "The agent's round").

The machine (agent/round/rules.py) decides; the executors only do it, through the rank control, the live
ranks, the resumption watch and the controller link, and the supervisor's finish (`AgentHooks`). `EXECUTORS`
is the mirror of the machine's rule table: it names the one executor of every action type, and is checked
when this module loads (an action type with none, or with two, fails the import). `carry_out` returns the
events the actions produced (a start's result, then the ranks found already gone when it returned, then a
resumption nothing can see), which the supervisor queues as the next events: a start never judges an exit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from taskd.agent.link.controller import ControllerLink
from taskd.agent.link.drain import Drain
from taskd.agent.link.report_policy import STATUS, STRATEGIES
from taskd.agent.ranks.control import Adopted, RankControl
from taskd.agent.ranks.launcher import MSRUN
from taskd.agent.ranks.live import IDLE_POLL, POLL, LiveRanks
from taskd.agent.ranks.migration import Migrations, Outcome, report_migration
from taskd.agent.ranks.node_migration import GaveUp, NodeMoves, Took
from taskd.agent.ranks.resumption import Resumption
from taskd.agent.ranks.table import RankState, RankTable
from taskd.agent.round import events as ev
from taskd.agent.round.states import LocalPolicy, NodeState
from taskd.agent.summary import SUPERSEDED, JobResult, RecoveryRecord, describe_restores
from taskd.agent.watches.exits import UNCAUGHT_EXITS, Bug, BugJudge, RankEnd, error_of
from taskd.agent.watches.hangs import HangWatch
from taskd.process.exitcodes import DUMP_INCOMPLETE_EXIT, DUMPED_EXIT
from taskd.vocabulary import Code, FaultRanks, Strategy
from taskd.worker.snapshot_account import read_restored

log = logging.getLogger("taskd.agent")
_OUTBOX_KINDS = {ev.STRATEGIES: STRATEGIES, ev.STATUS: STATUS}  # a WithdrawReports kind -> the outbox's report


@dataclass(frozen=True)
class AgentHooks:
    """What the supervisor lends the executors: ending the job, the failing rank's exit code, taking over a node."""

    finish: Callable[[bool, int, str], None]
    failure_code: Callable[[], int]
    capture_first_failure: Callable[[], None]  # before a new incarnation replaces the failed one
    take_node: Callable[[int], list[object]]  # a standby's assignment: lay out, register; the events it led to
    lay_out: Callable[[int], object]  # a node migration's successor: the rank table laid out as that node


@dataclass(frozen=True)
class Gone:
    """A rank found not running when a start returned: the supervisor judges it like any exit, next."""

    adopted: Adopted


class TableView:
    """The machine's read-only view of the node's ranks (states.NodeView)."""

    def __init__(self, table: RankTable, live: LiveRanks) -> None:
        self.table = table
        self.live = live

    def local_of(self, faults: FaultRanks) -> list[int]:
        return self.table.local_of(faults)

    def local_ranks(self) -> list[int]:
        return self.table.local_ranks()

    def live_fault(self, local_rank: int, faults: FaultRanks) -> bool:
        rank = self.table.get(local_rank)
        return rank is not None and self.live.live_fault(local_rank, faults.get(rank.global_rank, ""))



class Executors:
    """The machine's hands: the node's parts its actions need, and what those actions leave to watch (a restart's
    resumption, a live rebuild's progress, read from the ranks' files by `poll`)."""

    def __init__(self, table: RankTable, control: RankControl, link: ControllerLink, policy: LocalPolicy,
                 hang: HangWatch, result: JobResult, hooks: AgentHooks, live: LiveRanks | None = None,
                 snapshot_dir: str | None = None) -> None:
        self.table = table
        self.live = live if live is not None else LiveRanks(table, MSRUN)
        self.resumed_record: RecoveryRecord | None = None  # a live rebuild's, until its ranks resumed
        self.resumption = Resumption(table, lambda rank: hang.heartbeat(rank)[1],  # the other restarts'
                                     lambda rank: read_restored(snapshot_dir, rank.global_rank))
        self.control = control
        self.link = link
        self.policy = policy
        self.hang = hang
        self.result = result
        self.hooks = hooks
        self.last_start: tuple[list[int], dict[int, int | None]] = ([], {})  # local ranks, their steps before
        self.view = TableView(table, self.live)
        self.bugs = BugJudge()  # errors no restart mends (agent/watches/exits.py)
        self.migrations = Migrations(table, self.live, self.live.details, control.take_over,  # `taskd migrate`
                                     lambda outcome: report_migration(link, outcome))
        self.node_moves = NodeMoves(table, self.live, control, link, hooks.lay_out)  # `taskd migrate --node`
        self.drain = Drain(link, link.config.drain_file)  # SIGUSR1 or --drain-file: its own `taskd migrate --node`
        self.bug: Bug | None = None  # the last round's, when it was one: the job's end names it

    def carry_out(self, actions: list[ev.Action]) -> list[object]:
        """Do each action in order, by its executor; return the events they produced, to be handled next."""
        follow: list[object] = []
        for action in actions:
            follow += EXECUTORS[type(action)](self, action) or []
        return follow

    @property
    def polling(self) -> bool:
        """Whether the ranks' files must be read every ``POLL``: live recovery, or a resumption to see."""
        return self.live.enabled or self.resumption.pending or self.migrations.active is not None \
            or self.node_moves.active is not None

    def poll_every(self, state: NodeState) -> float:
        """Seconds between reads of the ranks' files (`polling`): POLL in a round, a resumption, a migration;
        IDLE_POLL between rounds where the ranks ring the agent's doorbell (`taskd.worker.env.ring_agent`) when
        they write an in-place error or a question: 20 reads a second cost the agent ~0.7 % of a core."""
        busy = state is not NodeState.RUNNING or self.live.rebuild is not None or self.resumption.pending \
            or self.migrations.active is not None or self.node_moves.active is not None
        return POLL if busy or self.control.watch.bell is None else IDLE_POLL

    def poll_migrations(self, now: float) -> list[object]:
        """A migration's progress; a node migration's successor that took its node, or gave up, is an event."""
        self.migrations.poll(now)
        self.drain.poll(self.table.layout.node_rank if self.table.layout is not None else None, now)
        done = self.node_moves.poll(now)
        if isinstance(done, Took):
            return [ev.SuccessorJoined(done.node_rank)]
        return [ev.SuccessorGaveUp(done.reason)] if isinstance(done, GaveUp) else []

    def poll(self, now: float) -> tuple[list[tuple[int, str]], list[object]]:
        """Every few ms: new retryable errors of live ranks (local rank, why), and the events the ranks' files
        show: a restart's resumption, a rebuild's progress."""
        events: list[object] = []
        seconds = self.resumption.check(now)
        if seconds is not None:
            events.append(ev.Resumed(seconds=seconds, at=now, restores=tuple(self.resumption.restores)))
        elif self.resumption.expire(now):  # a fresh agent's ranks wrote no heartbeat: said unseen, with restores
            events.append(ev.Resumed(seen=False, restores=tuple(self.resumption.restores)))
        if not self.live.enabled:
            return [], events
        errors = [(rank.local_rank, f"RetryableError at step {status.error_step}")
                  for rank, status in self.live.new_errors()]
        event = self.live.check(now)
        if isinstance(event, ev.Resumed) and self.resumed_record is not None:  # where the ranks restored from
            record = self.resumed_record
            restores = self.resumption.restored_since({r.local_rank: r.pid for r in self.table.all()},
                                                      record.started - record.restart_seconds)
            record.restored = describe_restores(restores)
            if restores:
                log.info("%s", record.restored)
                event = replace(event, restores=tuple(restores))
            self.resumed_record.resumed_at(event.seconds)  # "spent recovering" is fault -> resumed
            self.resumed_record = None
        if event is not None:
            events.append(event)
        return errors, events


# ------------------------------------------------------------------------------------------------ the executors
# One function per action type: (the hands, the action) -> the events it produced, or None.

def note(x: Executors, a: ev.Note) -> None:
    log.log(a.level, "%s", a.text)


def stop_ranks(x: Executors, a: ev.StopRanks) -> None:
    x.control.stop(x.table.all() if a.local is None else [x.table[lr] for lr in a.local], graceful=a.graceful)


def start_ranks(x: Executors, a: ev.StartRanks) -> list[object]:
    """Stop, then start the ranks (every rank: START_ALL_WORKER, msrun's scheduler too); the result and the ranks
    already gone are returned as events, in that order."""
    x.hooks.capture_first_failure()
    every = a.local is None
    ranks = [r.local_rank for r in x.table.all()] if a.local is None else list(a.local)
    x.last_start = (ranks, x.resumption.steps(ranks))
    x.control.stop(x.table.all() if every else [x.table[lr] for lr in ranks], graceful=False)
    if every:
        x.control.restart_msrun_scheduler()
    code, gone = x.control.start(None if every else ranks)
    if every:
        log.info("restarted %d rank(s) (rank:pid %s)%s", len(x.table), x.table.pids(),
                 "" if code == 0 else f"; START_ALL_WORKER returned {code}")
    msg = "" if code == 0 else (f"START_ALL_WORKER returned {code}" if every else
                                f"START_WORKER_LIST({ranks}) returned {code}")
    return [ev.StartResult(code, msg), *(Gone(adopted) for adopted in gone)]


def set_restart_count(x: Executors, a: ev.SetRestartCount) -> None:
    x.control.details.set_restart_count(a.restarts)
    if x.policy.degraded:  # a restart no controller counted: the controller hears of it (now, or at re-Register)
        x.link.reports.restarts(a.restarts)


def supersede(x: Executors, a: ev.Supersede) -> None:
    """A new fault's order: a rebuild still waiting for its ranks to resume never will; a restart's resumption may
    still be seen until the next restart replaces its ranks."""
    if x.resumed_record is not None and x.live.rebuild is not None:
        x.resumed_record.resumption = SUPERSEDED
    x.resumed_record = None
    x.live.abandon()
    if a.restart:
        x.resumption.supersede()


def begin_rebuild(x: Executors, a: ev.BeginRebuild) -> None:
    x.live.next_generation(a.generation)
    x.live.begin(a.strategy, a.faults, a.started, a.timeout, time.monotonic(), a.resize)


def leave_group(x: Executors, a: ev.LeaveGroup) -> None:
    x.live.leave()


def prepare_replacement(x: Executors, a: ev.PrepareReplacement) -> None:
    x.live.prepare(a.local_rank, x.link.config.offered_strategies, a.faults)


def abandon_rebuild(x: Executors, a: ev.AbandonRebuild) -> None:
    x.live.abandon()


def send_report(x: Executors, a: ev.SendReport) -> None:
    if a.kind == ev.FAULT:
        x.link.reports.fault(a.faults, a.detail, time.monotonic())
    elif a.kind == ev.STOP_COMPLETE:
        x.link.reports.stop_complete(a.faults)
    else:
        x.link.reports.status(a.code, a.detail, a.faults, a.strategy, a.rejoined)


def withdraw_reports(x: Executors, a: ev.WithdrawReports) -> None:
    for kind in (_OUTBOX_KINDS[k] for k in a.kinds):
        if n := x.link.reports.outbox.drop(kind):
            log.info("a new stopTrain: %d pending %s report(s) withdrawn (the controller moved past them)", n,
                     kind.what)


RESTARTS = frozenset({Strategy.RETRY, Strategy.RECOVER, Strategy.JOB_RESCHEDULING, *Strategy.RESIZE})


def offer_strategies(x: Executors, a: ev.OfferStrategies) -> None:
    offered = x.live.offer(x.link.config.offered_strategies, a.scope, x.link.config.scales)
    x.bug = bug = bug_of(x, a.scope)
    if bug is not None:  # the script's own error: no restart is offered, the controller ends the job (dump, exit)
        log.error("not restarted: %s", bug.describe())
        x.hooks.capture_first_failure()
        offered = [s for s in offered if s not in RESTARTS]
    x.link.reports.strategies(a.faults, offered)


def bug_of(x: Executors, faults: FaultRanks) -> Bug | None:
    """What watches/exits.py judges of this node's failed fault ranks: their errors, steps and run times, read here."""
    details = x.control.details
    states = {r.local_rank: x.hang.heartbeat(r)[1] for r in x.table.all()}
    any_step = any(s is not None and s.step is not None for s in states.values())
    ended = {f.pid: f.time for f in x.result.faults}
    ends = []
    for local_rank in x.table.local_of(faults):
        rank = x.table[local_rank]
        if rank.state is not RankState.FAILED:
            continue
        if rank.returncode not in UNCAUGHT_EXITS:  # a kill, a code of its own: a fault, and nothing to read
            return None
        try:
            recorded = details.error_report(local_rank)
            tail = details.tail_log(local_rank, 20)
            started = rank.proc.create_time() if rank.proc is not None else None
        except Exception as exc:  # a fact that cannot be read judges nothing: the round is a fault
            log.debug("rank %d's end: %s", rank.global_rank, exc)
            return None
        state = states.get(local_rank)
        error = error_of(rank.returncode, str(getattr(recorded, "exception", "") or ""), tail)
        ran = ended.get(rank.pid, time.time()) - started if started is not None else float("inf")
        ends.append(RankEnd(rank.global_rank, rank.pid, error, state.step if state is not None else None, any_step,
                            ran))
    return x.bugs.judge(ends)


def record_restart(x: Executors, a: ev.RecordRestart) -> list[object]:
    """The round's restart is done (ranks replaced, or a live group re-formed): not yet training again.

    Its one console record starts "replaced rank(s) R with STRATEGY" (retry in place: "retried rank(s)"); the
    round's "spent recovering" waits for "training resumed" (live.py's check, or `Resumption`). Nothing to watch
    (no rank restarted here, no heartbeats): `Resumed(seen=False)` is the next event."""
    strategy, ranks, degraded = a.strategy, list(a.ranks), a.degraded
    seconds = time.monotonic() - a.started
    if a.generation is not None:  # a live rebuild, reported once every local rank rejoined
        verb = "retried" if strategy == Strategy.RETRY else "replaced"
        milestone = "group re-formed"
        what = f"; the group re-formed (generation {a.generation})"
    else:
        verb, milestone = "replaced", "rank(s) replaced"
        what = ""
        if strategy == Strategy.JOB_RESCHEDULING:
            milestone, what = "every rank restarted", " (every rank restarted)"
    record = RecoveryRecord(strategy, ranks, time.time(), seconds, degraded, milestone)
    x.result.recoveries.append(record)
    if x.live.rebuild is not None:
        x.resumed_record = record
    else:
        local, steps = x.last_start if a.generation is None else ([], {})
        x.resumption.track(record, local, steps, a.started)
    pids = x.table.pids(ranks) if strategy != Strategy.RETRY else ""
    log.info("%s rank(s) %s with %s%s%s in %.3fs%s", verb, ranks, strategy, what,
             " (degraded: no controller)" if degraded else "", seconds, f" (now rank:pid {pids})" if pids else "")
    watched = x.live.rebuild is not None or x.resumption.pending
    return [] if watched else [ev.Resumed(seen=False)]


def tell_resumed(x: Executors, a: ev.TellResumed) -> None:
    x.link.reports.resumed(a.round, a.seconds, a.at, unseen=not a.seen, restores=a.restores)


def dump(x: Executors, a: ev.Dump) -> None:
    """Ask every healthy rank to save at its next step boundary, wait (bounded), then stop the job."""
    budget = x.policy.dump_budget(a.timeout)
    requests = {}
    unsaved = []
    for rank in x.table.in_state(RankState.RUNNING):
        hb, _ = x.hang.heartbeat(rank)
        if hb is None:
            unsaved.append(rank.global_rank)
            continue
        requests[rank.global_rank] = (hb, hb.request_save())
    log.info("dump: asked rank(s) %s to save (up to %.0fs)", sorted(requests), budget)
    deadline = time.monotonic() + budget
    saved = []
    for global_rank, (hb, number) in sorted(requests.items()):
        state = hb.wait_save(number, max(0.0, deadline - time.monotonic()))
        (saved if state is not None and state.save_ok else unsaved).append(global_rank)
    x.control.stop(x.table.all(), graceful=True)
    msg = f"saved: {sorted(saved)}; not saved: {sorted(unsaved)}"
    log.info("dump: %s", msg)
    complete = bool(saved) and not unsaved
    x.link.reports.status(Code.OK if complete else Code.DUMP_FAILED, msg, a.faults, Strategy.DUMP)
    x.hooks.finish(False, DUMPED_EXIT if complete else DUMP_INCOMPLETE_EXIT, f"dumped ({msg})")


def take_node(x: Executors, a: ev.TakeNode) -> list[object]:
    return x.hooks.take_node(a.node_rank)


def start_migration(x: Executors, a: ev.StartMigration) -> None:
    if a.order.stage:  # a node migration's (agent/ranks/node_migration.py)
        busy = "a migration is already in progress on this node" if x.migrations.active or x.node_moves.active \
            else "a recovery is in progress on this node" if x.live.rebuild is not None else ""
        x.node_moves.order(a.order.migration or a.order.uuid, a.order.stage, a.order.node_rank, a.order.generation,
                           a.refused, busy if a.order.stage != "off" else "", time.monotonic())
    elif a.refused:
        x.migrations.report(Outcome(a.order.uuid, a.order.rank or 0, False, a.refused))
    else:
        x.migrations.start(a.order.uuid, a.order.rank, a.order.generation, time.monotonic())


def start_job(x: Executors, a: ev.StartJob) -> list[object]:
    """The job's first start; a rank that never started, or already ended, is judged next like any exit."""
    code, gone = x.control.start(None)
    log.info("started %d rank(s) (rank:pid %s)%s", len(x.table), x.table.pids(),
             "" if code == 0 else f"; START_ALL_WORKER returned {code}")
    return [Gone(adopted) for adopted in gone]


def finish(x: Executors, a: ev.Finish) -> None:
    x.node_moves.ending()  # a node migration's leaving node ends here: it sends no finish
    x.result.moved = x.node_moves.moved if a.succeeded else ""
    reason = a.reason
    if not a.succeeded and x.bug is not None:  # the controller's exit only followed this node's verdict
        reason = f"the script's own error, not restarted: rank {x.bug.end.global_rank} raised {x.bug.end.error}"
    x.hooks.finish(a.succeeded, a.exit_code if a.exit_code is not None else x.hooks.failure_code(), reason)


Executor = Callable[[Executors, Any], list[object] | None]


def executor_table(pairs: tuple[tuple[type, Executor], ...]) -> dict[type, Executor]:
    """Every action type of events.ACTION_TYPES with exactly one executor, nothing else: else TypeError."""
    types = [kind for kind, _ in pairs]
    twice = sorted({k.__name__ for k in types if types.count(k) > 1})
    missing = sorted(k.__name__ for k in ev.ACTION_TYPES if k not in types)
    foreign = sorted(k.__name__ for k in types if k not in ev.ACTION_TYPES)
    if twice or missing or foreign:
        raise TypeError(f"the executor table is wrong: two executors for {twice}, none for {missing}, "
                        f"not actions: {foreign}")
    return dict(pairs)


EXECUTORS = executor_table((  # checked at import: the mirror of rules.RULES
    (ev.Note, note), (ev.StopRanks, stop_ranks), (ev.StartRanks, start_ranks),
    (ev.SetRestartCount, set_restart_count), (ev.Supersede, supersede), (ev.BeginRebuild, begin_rebuild),
    (ev.LeaveGroup, leave_group), (ev.PrepareReplacement, prepare_replacement),
    (ev.AbandonRebuild, abandon_rebuild), (ev.SendReport, send_report),
    (ev.WithdrawReports, withdraw_reports), (ev.OfferStrategies, offer_strategies),
    (ev.RecordRestart, record_restart), (ev.TellResumed, tell_resumed), (ev.Dump, dump), (ev.TakeNode, take_node),
    (ev.StartMigration, start_migration), (ev.StartJob, start_job), (ev.Finish, finish),
))

__all__ = ["EXECUTORS", "AgentHooks", "Executors", "Gone", "TableView", "executor_table"]
