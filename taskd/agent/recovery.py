"""Carrying out the round machine's actions: the mechanics of a recovery (docs/architecture.md, "The agent's round").

The machine (agent/round_machine.py) decides; this module only does it, through the rank control, the
live ranks, the resumption watch and the controller link, and the supervisor's finish (`AgentHooks`).
`carry_out` returns the events its actions produced (a start's result, then the ranks found already gone
when it returned, then a resumption nothing can see), which the supervisor queues as the next events: a
start never judges an exit itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from taskd.agent import round_events as ev
from taskd.agent.controller_link import ControllerLink
from taskd.agent.hang_watch import HangWatch
from taskd.agent.launcher_api import MSRUN
from taskd.agent.live import LiveRanks
from taskd.agent.rank_control import Adopted, RankControl
from taskd.agent.ranks import RankState, RankTable
from taskd.agent.reports import STRATEGIES
from taskd.agent.resumed_report import report_resumed
from taskd.agent.resumption import Resumption
from taskd.agent.round_state import LocalPolicy
from taskd.agent.summary import SUPERSEDED, JobResult, RecoveryRecord
from taskd.vocabulary import Code, FaultRanks, Strategy

log = logging.getLogger("taskd.agent")


@dataclass(frozen=True)
class AgentHooks:
    """What the supervisor lends the recovery: ending the job, and the failing rank's exit code."""

    finish: Callable[[bool, int, str], None]
    failure_code: Callable[[], int]
    capture_first_failure: Callable[[], None]  # before a new incarnation replaces the failed one
    take_node: Callable[[int | None], None] | None = None  # a standby's assignment (node-loss mechanics)


@dataclass(frozen=True)
class Gone:
    """A rank found not running when a start returned: the supervisor judges it like any exit, next."""

    adopted: Adopted


class TableView:
    """The machine's read-only view of the node's ranks (round_state.NodeView)."""

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


class Recovery:
    """The machine's hands: one method per action."""

    def __init__(self, table: RankTable, control: RankControl, link: ControllerLink, policy: LocalPolicy,
                 hang: HangWatch, result: JobResult, hooks: AgentHooks, live: LiveRanks | None = None) -> None:
        self.table = table
        self.live = live if live is not None else LiveRanks(table, MSRUN)
        self._resumed_record: RecoveryRecord | None = None  # a live rebuild's, until its ranks resumed
        self.resumption = Resumption(table, lambda rank: hang.heartbeat(rank)[1])  # the other restarts'
        self.control = control
        self.link = link
        self.policy = policy
        self.hang = hang
        self.result = result
        self.hooks = hooks
        self._last_start: tuple[list[int], dict[int, int | None]] = ([], {})  # local ranks, their steps before
        self.view = TableView(table, self.live)

    def carry_out(self, actions: list[ev.Action]) -> list[object]:
        """Do each action in order; return the events they produced, to be handled next (in that order)."""
        follow: list[object] = []
        for action in actions:
            follow += self._do(action) or []
        return follow

    def _do(self, action: ev.Action) -> list[object] | None:  # noqa: PLR0911 (one branch per action type)
        if isinstance(action, ev.Note):
            log.log(action.level, "%s", action.text)
        elif isinstance(action, ev.StopRanks):
            ranks = self.table.all() if action.local is None else [self.table[lr] for lr in action.local]
            self.control.stop(ranks, graceful=action.graceful)
        elif isinstance(action, ev.StartRanks):
            return self._start(action.local)
        elif isinstance(action, ev.SetRestartCount):
            self.control.details.set_restart_count(action.restarts)
        elif isinstance(action, ev.Supersede):
            self._supersede(action.restart)
        elif isinstance(action, ev.BeginRebuild):
            self.live.next_generation(action.generation)
            self.live.begin(action.strategy, action.faults, action.started, action.timeout, time.monotonic(),
                            action.resize)
        elif isinstance(action, ev.LeaveGroup):
            self.live.leave()
        elif isinstance(action, ev.PrepareReplacement):
            self.live.prepare(action.local_rank, self.link.config.offered_strategies, action.faults)
        elif isinstance(action, ev.AbandonRebuild):
            self.live.abandon()
        elif isinstance(action, ev.SendReport):
            self._report(action)
        elif isinstance(action, ev.WithdrawStrategies):
            if n := self.link.outbox.drop(STRATEGIES):
                log.info("a new stopTrain: %d strategies report(s) for the round's earlier collection withdrawn", n)
        elif isinstance(action, ev.OfferStrategies):
            self.link.report_strategies(action.faults, self.live.offer(self.link.config.offered_strategies,
                                                                       action.scope, self.link.config.scales))
        elif isinstance(action, ev.RecordRestart):
            return self._restarted(action)
        elif isinstance(action, ev.TellResumed):
            report_resumed(self.link, action.round, action.seconds, action.at, unseen=not action.seen)
        elif isinstance(action, ev.Dump):
            self._dump(action)
        elif isinstance(action, ev.TakeNode):
            if self.hooks.take_node is None:
                log.error("assignNode for node %s: this agent cannot take over a node", action.node_rank)
            else:
                self.hooks.take_node(action.node_rank)
        elif isinstance(action, ev.Finish):
            code = action.exit_code if action.exit_code is not None else self.hooks.failure_code()
            self.hooks.finish(action.succeeded, code, action.reason)
        else:
            raise TypeError(f"not an action: {action!r}")
        return None

    def _report(self, action: ev.SendReport) -> None:
        if action.kind == ev.FAULT:
            self.link.report_fault(action.faults, action.detail, time.monotonic())
        elif action.kind == ev.STOP_COMPLETE:
            self.link.report_stop_complete(action.faults)
        else:
            self.link.report_status(action.code, action.detail, action.faults, action.strategy, action.rejoined)

    def _start(self, local: tuple[int, ...] | None) -> list[object]:
        """Stop, then start the ranks (every rank: START_ALL_WORKER, msrun's scheduler too); the result and the
        ranks already gone are returned as events, in that order."""
        self.hooks.capture_first_failure()
        every = local is None
        ranks = [r.local_rank for r in self.table.all()] if every else list(local)
        self._last_start = (ranks, self.resumption.steps(ranks))
        self.control.stop(self.table.all() if every else [self.table[lr] for lr in ranks], graceful=False)
        if every:
            self.control.restart_msrun_scheduler()
        code, gone = self.control.start(None if every else ranks)
        if every:
            log.info("restarted %d rank(s) (rank:pid %s)%s", len(self.table), self.table.pids(),
                     "" if code == 0 else f"; START_ALL_WORKER returned {code}")
        msg = "" if code == 0 else (f"START_ALL_WORKER returned {code}" if every else
                                    f"START_WORKER_LIST({ranks}) returned {code}")
        return [ev.StartResult(code, msg), *(Gone(a) for a in gone)]

    def _supersede(self, restart: bool) -> None:
        """A new fault's order: a rebuild still waiting for its ranks to resume never will; a restart's
        resumption may still be seen until the next restart replaces its ranks."""
        if self._resumed_record is not None and self.live.rebuild is not None:
            self._resumed_record.resumption = SUPERSEDED
        self._resumed_record = None
        self.live.abandon()
        if restart:
            self.resumption.supersede()

    def _dump(self, action: ev.Dump) -> None:
        """Ask every healthy rank to save at its next step boundary, wait (bounded), then stop the job."""
        budget = self.policy.dump_budget(action.timeout)
        requests = {}
        unsaved = []
        for rank in self.table.in_state(RankState.RUNNING):
            hb, _ = self.hang.heartbeat(rank)
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
        self.control.stop(self.table.all(), graceful=True)
        msg = f"saved: {sorted(saved)}; not saved: {sorted(unsaved)}"
        log.info("dump: %s", msg)
        self.link.report_status(Code.OK if saved and not unsaved else Code.DUMP_FAILED, msg, action.faults,
                                Strategy.DUMP)
        self.hooks.finish(False, self.hooks.failure_code(), f"dumped ({msg})")

    @property
    def polling(self) -> bool:
        """Whether the ranks' files must be read every ``POLL``: live recovery, or a resumption to see."""
        return self.live.enabled or self.resumption.pending

    def poll(self, now: float) -> tuple[list[tuple[int, str]], list[object]]:
        """Every few ms: new retryable errors of live ranks (local rank, why), and the events the ranks' files
        show: a restart's resumption, a rebuild's progress."""
        events: list[object] = []
        seconds = self.resumption.check(now)
        if seconds is not None:
            events.append(ev.Resumed(seconds=seconds, at=now))
        if not self.live.enabled:
            return [], events
        errors = [(rank.local_rank, f"RetryableError at step {status.error_step}")
                  for rank, status in self.live.new_errors()]
        rebuild = self.live.rebuild
        state = self.live.check(now)
        if state is None or rebuild is None:
            return errors, events
        what, detail = state
        if what == "failed":
            events.append(ev.GroupFailed(detail))
        elif what == "rejoined":
            events.append(ev.GroupRejoined(rebuild.generation, rebuild.started))
        elif what == "resumed":
            seconds = now - rebuild.started
            log.info("training resumed %.3fs after the fault (generation %d, %s; %s)", seconds, rebuild.generation,
                     rebuild.strategy, detail)
            if self._resumed_record is not None:
                self._resumed_record.resumed_at(seconds)  # "spent recovering" is fault -> resumed
                self._resumed_record = None
            events.append(ev.Resumed(seconds=seconds, at=now))
        return errors, events

    def _restarted(self, action: ev.RecordRestart) -> list[object]:
        """The round's restart is done (ranks replaced, or a live group re-formed): not yet training again.

        Its one console record starts "replaced rank(s) R with STRATEGY" (retry in place: "retried rank(s)");
        the round's "spent recovering" waits for "training resumed" (live.py's check, or `Resumption`).
        Nothing to watch (no rank restarted here, no heartbeats): `Resumed(seen=False)` is the next event."""
        strategy, ranks, degraded = action.strategy, list(action.ranks), action.degraded
        seconds = time.monotonic() - action.started
        if action.generation is not None:  # a live rebuild, reported once every local rank rejoined
            verb = "retried" if strategy == Strategy.RETRY else "replaced"
            milestone = "group re-formed"
            what = f"; the group re-formed (generation {action.generation})"
        else:
            verb, milestone = "replaced", "rank(s) replaced"
            what = ""
            if strategy == Strategy.JOB_RESCHEDULING:
                milestone, what = "every rank restarted", " (every rank restarted)"
        record = RecoveryRecord(strategy, ranks, time.time(), seconds, degraded, milestone)
        self.result.recoveries.append(record)
        if self.live.rebuild is not None:
            self._resumed_record = record
        else:
            local, steps = self._last_start if action.generation is None else ([], {})
            self.resumption.track(record, local, steps, action.started)
        pids = self.table.pids(ranks) if strategy != Strategy.RETRY else ""
        log.info("%s rank(s) %s with %s%s%s in %.3fs%s", verb, ranks, strategy, what,
                 " (degraded: no controller)" if degraded else "", seconds, f" (now rank:pid {pids})" if pids else "")
        watched = self.live.rebuild is not None or self.resumption.pending
        return [] if watched else [ev.Resumed(seen=False)]


__all__ = ["AgentHooks", "Gone", "Recovery", "TableView"]
