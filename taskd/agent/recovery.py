"""Carrying out recoveries: the controller's orders (stop, strategies, change, dump, kill) and, with
no controller, the local whole-node restart that degraded mode allows.

A recovery round opens with the first fault and closes when its ranks run again; `Round` holds its
fault ranks and start time. With live recovery (`agent/live.py`) recover and retry keep the healthy
ranks: the round is reported to the controller only once every local rank has rejoined the new
generation, and "training resumed" once every rank has completed a step in it. Other restarts are
followed to training's resumption through the ranks' heartbeat files (`agent/resumption.py`).

What to do is the controller's decision (or `LocalPolicy`'s when there
is none); this module only does it, through the supervisor's start/stop/finish (`AgentHooks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from taskd.agent.controller_link import ControllerLink, Order
from taskd.agent.hang_watch import HangWatch
from taskd.agent.launcher_api import MSRUN
from taskd.agent.live import LiveRanks
from taskd.agent.policy import LocalPolicy
from taskd.agent.rank_control import RankControl
from taskd.agent.ranks import RankState, RankTable
from taskd.agent.resumption import Resumption
from taskd.agent.summary import SUPERSEDED, JobResult, RecoveryRecord
from taskd.vocabulary import Code, FaultRanks, Strategy

log = logging.getLogger("taskd.agent")


@dataclass
class Round:
    """The recovery in progress: the fault ranks seen since it opened, and when it opened (monotonic)."""

    faults: FaultRanks = field(default_factory=dict)
    started: float | None = None
    charged: bool = False  # a restart of this round was counted (a failed recover + job-rescheduling: one)

    def add(self, faults: FaultRanks, now: float, keep_known: bool = False) -> None:
        for rank, fault_type in faults.items():
            if keep_known:
                self.faults.setdefault(rank, fault_type)
            else:
                self.faults[rank] = fault_type
        if self.started is None:
            self.started = now

    @property
    def open(self) -> bool:
        return bool(self.faults)

    def close(self) -> None:
        self.faults.clear()
        self.started = None
        self.charged = False


@dataclass(frozen=True)
class AgentHooks:
    """What the supervisor lends the recovery: starting ranks (its exits judged), ending the job."""

    start: Callable[[list[int]], int]  # START_WORKER_LIST
    start_all: Callable[[], int]  # START_ALL_WORKER, with the "restarted ..." line
    finish: Callable[[bool, int, str], None]
    failure_code: Callable[[], int]


class Recovery:
    """One handler per controller command, plus the degraded local restart."""

    def __init__(self, table: RankTable, control: RankControl, link: ControllerLink, policy: LocalPolicy,
                 hang: HangWatch, result: JobResult, hooks: AgentHooks, live: LiveRanks | None = None) -> None:
        self.table = table
        self.live = live if live is not None else LiveRanks(table, MSRUN, lambda: None)
        self.restarts = 0  # job-wide restarts (once per round that restarts anything), the same on every node
        self._resumed_record: RecoveryRecord | None = None  # a live rebuild's, until its ranks resumed
        self.resumption = Resumption(table, lambda rank: hang.heartbeat(rank)[1])  # the other restarts'
        self.control = control
        self.link = link
        self.policy = policy
        self.hang = hang
        self.result = result
        self.hooks = hooks
        self.round = Round()

    def on_stop(self, order: Order) -> None:
        self.round.add(order.fault_ranks, time.monotonic(), keep_known=True)
        self._abandon(restart=False)
        # a live rank with a type-"0" fault is paused in place, waiting to retry: it must not be killed
        stop = [lr for lr in self.table.local_of(order.fault_ranks)
                if not self.live.live_fault(lr, order.fault_ranks.get(self.table[lr].global_rank, ""))]
        self.control.stop([self.table[lr] for lr in stop], graceful=False)
        self.link.report_stop_complete(order.fault_ranks)

    def on_strategies(self, order: Order) -> None:
        configured = self.link.config.offered_strategies
        self.link.report_strategies(order.fault_ranks,
                                    self.live.offer(configured, dict(self.round.faults) | order.fault_ranks))

    def on_change(self, order: Order) -> None:
        strategy = order.strategy
        faults = order.fault_ranks or dict(self.round.faults)
        started = self.round.started or time.monotonic()
        log.info("strategy: %s for rank(s) %s", strategy, sorted(faults))
        if strategy in (Strategy.RECOVER, Strategy.JOB_RESCHEDULING) or \
                (strategy == Strategy.RETRY and self.live.enabled):
            self._restart(strategy, faults, started, order)
        elif strategy == Strategy.DUMP:
            self.on_dump(order)
        elif strategy == Strategy.EXIT:
            why = order.reason()
            if why:
                log.warning("the controller ends the job: %s", why)
            self.control.stop(self.table.all(), graceful=True)
            self.link.report_status(Code.OK, "", faults, strategy)
            self.hooks.finish(False, self.hooks.failure_code(), f"the controller chose exit{': ' + why if why else ''}")
        else:
            log.warning("strategy %r is not one this agent carries out", strategy)
            self.link.report_status(Code.RETRY_FAILED_UNRECOVERABLE, f"unsupported strategy {strategy}", faults,
                                    strategy)

    def on_dump(self, order: Order) -> None:
        """Ask every healthy rank to save at its next step boundary, wait (bounded), then stop the job."""
        faults = order.fault_ranks or dict(self.round.faults)
        budget = self.policy.dump_budget(order.timeout)
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
        self.link.report_status(Code.OK if saved and not unsaved else Code.DUMP_FAILED, msg, faults, Strategy.DUMP)
        self.hooks.finish(False, self.hooks.failure_code(), f"dumped ({msg})")

    def on_kill(self, order: Order) -> None:
        why = order.reason()
        log.warning("controller sent %s%s: stopping every rank", order.signal_type or list(order.actions),
                    f" ({why})" if why else "")
        self.hooks.finish(False, self.hooks.failure_code(),
                          f"controller sent {order.signal_type}{': ' + why if why else ''}")

    def _restart(self, strategy: str, faults: FaultRanks, started: float, order: Order | None = None) -> None:
        """Carry out recover (the faulty local ranks), retry (no restart) or job-rescheduling (every rank)
        and report it; with live recovery a recover or retry is reported once the group has re-formed."""
        live = self.live.enabled and order is not None
        if strategy != Strategy.RETRY:
            self._charge()
        self._abandon()
        if live:
            assert order is not None
            self.live.next_generation(order.extra_params)
            self.live.begin(strategy, faults, started, order.timeout, time.monotonic())
        if strategy == Strategy.RETRY:
            return  # the paused ranks redo the step when they read the control file; confirmed in poll()
        if strategy == Strategy.RECOVER:
            local = [lr for lr in self.table.local_of(faults) if not self.live.live_fault(lr, faults.get(
                self.table[lr].global_rank, ""))]
            steps = self.resumption.steps(local)
            self.control.stop([self.table[lr] for lr in local], graceful=False)
            code = self.hooks.start(local)
            msg = "" if code == 0 else f"START_WORKER_LIST({local}) returned {code}"
            if live and code == 0:
                return  # reported when every local rank has rejoined (poll)
        else:
            local = [r.local_rank for r in self.table.all()]
            steps = self.resumption.steps(local)
            self.control.stop(self.table.all(), graceful=False)
            self.control.restart_msrun_scheduler()
            code = self.hooks.start_all()
            msg = "" if code == 0 else f"START_ALL_WORKER returned {code}"
        if code != 0:
            self.live.abandon()
        self.link.report_status(Code.OK if code == 0 else 1, msg, faults, strategy)
        if code == 0:
            self._restarted(strategy, sorted(faults), started, local, steps)

    def _charge(self) -> None:
        """Count a restart once per round (a recover that fails and escalates is one restart, not two) and
        give ranks started from now on the job-wide count (TASKD_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT)."""
        if not self.round.charged:
            self.round.charged = True
            self.restarts += 1
        self.control.details.set_restart_count(self.restarts)

    def absorbs(self, local_rank: int) -> bool:
        """A rank that ends while its group re-forms fails that recover (reported by poll), not a round of its own."""
        rebuild = self.live.rebuild
        return rebuild is not None and rebuild.report and rebuild.confirmed is None

    def _abandon(self, restart: bool = True) -> None:
        """A new fault's order: a rebuild still waiting for its ranks to resume never will; a restart's
        resumption may still be seen until the next restart replaces its ranks."""
        if self._resumed_record is not None and self.live.rebuild is not None:
            self._resumed_record.resumption = SUPERSEDED
        self._resumed_record = None
        self.live.abandon()
        if restart:
            self.resumption.supersede()

    @property
    def polling(self) -> bool:
        """Whether the ranks' files must be read every ``POLL``: live recovery, or a resumption to see."""
        return self.live.enabled or self.resumption.pending

    def poll(self, now: float) -> list[tuple[int, str]]:
        """Every few ms: a restart's resumption; with live recovery, new retryable errors (returned: local rank,
        why) and the rebuild's progress."""
        self.resumption.check(now)
        if not self.live.enabled:
            return []
        errors = [(rank.local_rank, f"RetryableError at step {status.error_step}")
                  for rank, status in self.live.new_errors()]
        rebuild = self.live.rebuild
        state = self.live.check(now)
        if state is None or rebuild is None:
            return errors
        what, detail = state
        faults, strategy = rebuild.faults, rebuild.strategy
        if what == "failed":
            self.live.abandon()
            log.warning("live recovery failed: %s", detail)
            if rebuild.report:
                self.link.report_status(Code.RETRY_FAILED_UNRECOVERABLE if strategy == Strategy.RETRY else 1,
                                        detail, faults, strategy)
        elif what == "rejoined":
            if rebuild.report:
                self.link.report_status(Code.OK, "", faults, strategy)
                self._restarted(strategy, sorted(faults), rebuild.started, generation=rebuild.generation)
            else:
                log.info("the group re-formed (generation %d, %s) %.3fs after the fault", rebuild.generation,
                         strategy, now - rebuild.started)
        elif what == "resumed":
            seconds = now - rebuild.started
            log.info("training resumed %.3fs after the fault (generation %d, %s; %s)", seconds, rebuild.generation,
                     strategy, detail)
            if self._resumed_record is not None:
                self._resumed_record.resumed_at(seconds)  # "spent recovering" is fault -> resumed
                self._resumed_record = None
        return errors

    def local_restart(self) -> None:
        """No controller: restart the whole node's ranks while the budget lasts (a single node keeps training)."""
        number = self.policy.spend_restart()
        if number is None:
            self.hooks.finish(False, self.hooks.failure_code(), f"restart budget of {self.policy.max_restarts} spent")
            return
        log.warning("degraded: local job-rescheduling (restart %d of %d)", number, self.policy.max_restarts)
        started = self.round.started or time.monotonic()
        ranks = sorted(self.round.faults)
        self._charge()
        self._abandon()
        if self.live.enabled:
            self.live.generation += 1
            self.live.begin(Strategy.JOB_RESCHEDULING, dict(self.round.faults), started, 0.0, time.monotonic())
        local = [r.local_rank for r in self.table.all()]
        steps = self.resumption.steps(local)
        self.control.stop(self.table.all(), graceful=False)
        if self.hooks.start_all() == 0:
            self._restarted(Strategy.JOB_RESCHEDULING, ranks, started, local, steps, degraded=True)

    def _restarted(self, strategy: str, ranks: list[int], started: float, local: list[int] | None = None,
                   steps: dict[int, int | None] | None = None, degraded: bool = False,
                   generation: int | None = None) -> None:
        """The round's restart is done (ranks replaced, or a live group re-formed): not yet training again.

        Its one console record starts "replaced rank(s) R with STRATEGY" (retry in place: "retried rank(s)");
        the round's "spent recovering" waits for "training resumed" (live.py's check, or `Resumption`)."""
        seconds = time.monotonic() - started
        if generation is not None:  # a live rebuild, reported once every local rank rejoined
            verb = "retried" if strategy == Strategy.RETRY else "replaced"
            milestone = "group re-formed"
            what = f"; the group re-formed (generation {generation})"
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
            self.resumption.track(record, local or [], steps or {}, started)
        pids = self.table.pids(ranks) if strategy != Strategy.RETRY else ""
        log.info("%s rank(s) %s with %s%s%s in %.3fs%s", verb, ranks, strategy, what,
                 " (degraded: no controller)" if degraded else "", seconds, f" (now rank:pid {pids})" if pids else "")
        self.round.close()
