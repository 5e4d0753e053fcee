"""Carrying out recoveries: the controller's orders (stop, strategies, change, dump, kill) and, with
no controller, the local whole-node restart that degraded mode allows.

A recovery round opens with the first fault and closes when its ranks run again; `Round` holds its
fault ranks and start time. What to do is the controller's decision (or `LocalPolicy`'s when there
is none); this module only does it, through the supervisor's start/stop/finish (`AgentHooks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from taskd.agent.controller_link import ControllerLink, Order
from taskd.agent.hang_watch import HangWatch
from taskd.agent.policy import LocalPolicy
from taskd.agent.rank_control import RankControl
from taskd.agent.ranks import RankState, RankTable
from taskd.agent.summary import JobResult, RecoveryRecord
from taskd.vocabulary import Code, FaultRanks, Strategy

log = logging.getLogger("taskd.agent")


@dataclass
class Round:
    """The recovery in progress: the fault ranks seen since it opened, and when it opened (monotonic)."""

    faults: FaultRanks = field(default_factory=dict)
    started: float | None = None

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
                 hang: HangWatch, result: JobResult, hooks: AgentHooks) -> None:
        self.table = table
        self.control = control
        self.link = link
        self.policy = policy
        self.hang = hang
        self.result = result
        self.hooks = hooks
        self.round = Round()

    def on_stop(self, order: Order) -> None:
        self.round.add(order.fault_ranks, time.monotonic(), keep_known=True)
        self.control.stop([self.table[lr] for lr in self.table.local_of(order.fault_ranks)], graceful=False)
        self.link.report_stop_complete(order.fault_ranks)

    def on_strategies(self, order: Order) -> None:
        self.link.report_strategies(order.fault_ranks)

    def on_change(self, order: Order) -> None:
        strategy = order.strategy
        faults = order.fault_ranks or dict(self.round.faults)
        started = self.round.started or time.monotonic()
        log.info("strategy: %s for rank(s) %s", strategy, sorted(faults))
        if strategy in (Strategy.RECOVER, Strategy.JOB_RESCHEDULING):
            self._restart(strategy, faults, started)
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

    def _restart(self, strategy: str, faults: FaultRanks, started: float) -> None:
        """Carry out recover (the faulty local ranks) or job-rescheduling (every rank) and report it."""
        if strategy == Strategy.RECOVER:
            local = self.table.local_of(faults)
            self.control.stop([self.table[lr] for lr in local], graceful=False)
            code = self.hooks.start(local)
            msg = "" if code == 0 else f"START_WORKER_LIST({local}) returned {code}"
        else:
            self.control.stop(self.table.all(), graceful=False)
            self.control.restart_msrun_scheduler()
            code = self.hooks.start_all()
            msg = "" if code == 0 else f"START_ALL_WORKER returned {code}"
        self.link.report_status(Code.OK if code == 0 else 1, msg, faults, strategy)
        if code == 0:
            self._recovered(strategy, sorted(faults), started)

    def local_restart(self) -> None:
        """No controller: restart the whole node's ranks while the budget lasts (a single node keeps training)."""
        number = self.policy.spend_restart()
        if number is None:
            self.hooks.finish(False, self.hooks.failure_code(), f"restart budget of {self.policy.max_restarts} spent")
            return
        log.warning("degraded: local job-rescheduling (restart %d of %d)", number, self.policy.max_restarts)
        started = time.monotonic()
        ranks = sorted(self.round.faults)
        self.control.stop(self.table.all(), graceful=False)
        if self.hooks.start_all() == 0:
            self._recovered(Strategy.JOB_RESCHEDULING, ranks, started, degraded=True)

    def _recovered(self, strategy: str, ranks: list[int], started: float, degraded: bool = False) -> None:
        seconds = time.monotonic() - started
        self.result.recoveries.append(RecoveryRecord(strategy, ranks, time.time(), seconds, degraded))
        pids = self.table.pids(ranks)
        log.info("recovered rank(s) %s with %s in %.3fs%s", ranks, strategy, seconds,
                 f" (now rank:pid {pids})" if pids else "")
        self.round.close()
