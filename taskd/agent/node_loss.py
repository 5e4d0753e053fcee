"""A node's part when a node of its job is lost (issue 17; the contract is docs/architecture.md's node-loss path).

Three ways an agent meets a node loss, each apart from the recovery round it then joins as usual:

- a **replacement**: started for a node rank the controller declared lost (`taskd run --node-rank R`
  on a new host, a restarted pod). Right after registering it finds its node rank in the job's
  `rejoining` list; it starts no rank on its own and waits, bounded by TASKD_NODE_REJOIN_TIMEOUT, for
  the round's changeStrategy, which starts its ranks (they never ran: recover starts all of them in
  the order's generation, job-rescheduling starts them with everyone's);
- a **standby** (`taskd run --standby`): joins with no node, waits until the controller assigns it a
  lost node's rank (`taskd.assignNode`) or the job ends (exit 0: it was not needed), then takes that
  node rank (the launcher's `set_node_rank`) and proceeds as a replacement. An agent started for a node
  rank that a replacement already holds (Kubernetes' recreated pod of a node a standby took over;
  held_node.py) becomes one, as does a standby whose assigned node another replacement took first;
- a **fenced** agent: one the controller declared lost that came back (SIGSTOP/SIGCONT, a healed
  partition). Whatever said so (a 411 answer, a `taskd.fenced` signal, the answer to its own question
  when cut off), it stops every rank first, so none acts for the node again, and exits 1 with the
  controller's words naming what replaced it (the round machine's FenceOrder rule).

The decisions are pure functions below; `NodeLoss` carries them out with the agent's parts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from taskd.agent.config import AgentConfig
from taskd.agent.controller_link import ControllerLink
from taskd.agent.launcher_api import Launcher, NodeRankFixed
from taskd.agent.orders import Command, Order
from taskd.agent.ranks import RankLayout, RankState, RankTable
from taskd.vocabulary import FaultType, Strategy

log = logging.getLogger("taskd.agent")

JOB_POLL = 1.0  # seconds between a standby's questions whether its job still runs
ENDED = ("SUCCEEDED", "FAILED")


def assigned_node(order: Order) -> int | None:
    """The node rank a taskd.assignNode names (extraParams {"node_rank": R}, parsed in Order.of); None if none."""
    return order.node_rank


@dataclass(frozen=True)
class StandbyEnd:
    """How a standby's wait ended: `node_rank` is set when it was assigned one; otherwise `why` says why not
    ("job ended", "fenced", "signal", "controller lost")."""

    node_rank: int | None
    why: str
    detail: str = ""

    @property
    def needed(self) -> bool:
        return self.node_rank is not None


def standby_step(order: Order | None, state: str | None) -> StandbyEnd | None:
    """A standby's wait, one look at a time: an order it was sent (or None) and its job's state on the controller
    (None: not asked, or no answer). Returns how the wait ends, or None to keep waiting."""
    if order is not None:
        if order.command is Command.ASSIGN:
            node = assigned_node(order)
            if node is not None:
                return StandbyEnd(node, "assigned")
            log.warning("taskd.assignNode %s names no node rank (extraParams %r): ignored", order.uuid,
                        order.extra_params)
        elif order.command is Command.FENCE:
            return StandbyEnd(None, "fenced", order.reason())
        elif order.command is Command.KILL or (order.command is Command.CHANGE and order.strategy == Strategy.EXIT):
            return StandbyEnd(None, "job ended", order.reason() or order.signal_type)
    if state in ENDED:
        return StandbyEnd(None, "job ended", f"the job is {state}")
    if state == "":
        return StandbyEnd(None, "job ended", "the controller no longer knows the job")
    return None


def replacement_overdue(waiting_since: float | None, now: float, timeout: float) -> bool:
    """A replacement that has waited `timeout` seconds for its round's strategy gives up (its ranks never ran)."""
    return waiting_since is not None and now - waiting_since >= timeout


class JobSource(Protocol):
    def next_order(self) -> Order | None: ...

    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None: ...


def await_assignment(link: JobSource, wait: Callable[[float], object], interrupted: Callable[[], bool],
                     clock: Callable[[], float] = time.monotonic, silence: float = float("inf")) -> StandbyEnd:
    """Wait, as a standby, until a node is assigned or the job ends (see standby_step), or until the controller
    has not answered for `silence` seconds: a standby nobody can assign must not wait forever."""
    next_poll = clock()
    answered = clock()
    while True:
        state = None
        if clock() >= next_poll:
            answer = link.job_state(timeout=2.0)
            state = answer[0] if answer is not None else None
            if answer is not None:
                answered = clock()
            elif clock() - answered >= silence:
                return StandbyEnd(None, "controller lost", f"no answer from the controller for {silence:.0f}s "
                                  "(TASKD_CONTROLLER_TIMEOUT)")
            next_poll = clock() + JOB_POLL
        order = link.next_order()
        end = standby_step(order, state)
        while end is None and order is not None:  # every queued order is read before sleeping
            order = link.next_order()
            end = standby_step(order, None)
        if end is not None:
            return end
        if interrupted():
            return StandbyEnd(None, "signal")
        wait(max(0.0, next_poll - clock()))


class NodeLoss:
    """Carries out the node-loss decisions with the agent's parts (the supervisor sequences the calls).

    The fence order itself is the round machine's (round_table.py: any state, FenceOrder -> FENCED: every rank
    SIGKILLed first, then exit 1); what turns a 411 or a `taskd.fenced` into that order is controller_link.py's."""

    def __init__(self, config: AgentConfig, link: ControllerLink, table: RankTable, launcher: Launcher,
                 finish: Callable[[bool, int, str], None]) -> None:
        self.config = config
        self.link = link
        self.table = table
        self.launcher = launcher
        self.finish = finish
        self.waiting_since: float | None = None  # a replacement's wait for its round's strategy

    @property
    def replacement(self) -> bool:
        """This agent registered for a lost node and waits for the round's strategy to start its ranks."""
        return self.waiting_since is not None

    # -- a standby -------------------------------------------------------------------------------------
    def await_node(self, job_id: str, layout: RankLayout, wait: Callable[[float], object],
                   interrupted: Callable[[], bool]) -> bool:
        """Join as a standby and wait for a node. True once it is node R (the launcher and the configuration say
        so; the caller lays the ranks out and registers as R); False when the job ended here (finish called)."""
        if self.link.active:  # it was assigned a node another agent took first (yield_node): it waits again
            log.info("standby for job %s: waiting again for a lost node to take over (or the job's end)", job_id)
        elif not self.link.connect(job_id, layout, as_standby=True):
            refused = self.link.refusal
            self.finish(False, 1, f"the controller refused this standby: {refused}" if refused else
                        "a standby needs the job's controller, and none answered")
            return False
        else:
            log.info("standby for job %s: waiting for a lost node to take over (or the job's end)", job_id)
        end = await_assignment(self.link, wait, interrupted, silence=self.config.controller_timeout)
        if end.why == "controller lost":
            self.finish(False, 1, f"standby: {end.detail}")
            return False
        if end.why == "signal":
            self.finish(False, 1, "standby stopped by a signal before it was needed")
            return False
        if end.why == "fenced":
            self.finish(False, 1, f"fenced: {end.detail}")
            return False
        if not end.needed:
            log.info("standby not needed: %s", end.detail)
            self.finish(True, 0, f"standby, not needed ({end.detail})")
            return False
        try:
            self.launcher.set_node_rank(end.node_rank)  # type: ignore[arg-type]
        except (NodeRankFixed, ValueError, RuntimeError) as exc:
            log.error("cannot take over node %s: %s", end.node_rank, exc)
            self.finish(False, 2, f"cannot take over node {end.node_rank}: {exc}")
            return False
        self.config.node_rank = end.node_rank
        log.info("this standby takes over node %d", end.node_rank)
        return True

    def yield_node(self, job_id: str, node_rank: int) -> bool:
        """Refused node `node_rank` because a replacement holds it (held_node.py: the lost node's recreated pod, a
        standby that lost the race for an assigned node): True when this agent is to join as a standby instead."""
        holder, self.link.taken_by = self.link.taken_by, None
        if holder is None:
            return False
        try:  # no node until one is assigned: node 0's launcher stops listening on the store's port
            self.launcher.set_node_rank(None)
        except (NodeRankFixed, ValueError, RuntimeError) as exc:  # msrun's node rank cannot change: the refusal
            log.debug("node %d cannot become a standby: %s", node_rank, exc)
            return False
        log.info("node %d of job %s is held by %s, the replacement of its lost agent: this agent joins the job as a "
                 "standby instead (it takes over the next node lost, or exits 0 when the job ends)", node_rank,
                 job_id, holder)
        self.config.standby = True
        return True

    # -- a replacement ------------------------------------------------------------------------------
    def check_replacement(self, layout: RankLayout, now: float, standby: bool) -> None:
        """Right after registering: a node rank the job's open node-loss round waits for is a replacement's (a
        standby given a node always is). It then starts no rank itself: the round's strategy does."""
        if layout.node_count <= 1 and not standby:
            return
        rejoining = self.link.rejoining_at_register
        if not standby and (rejoining is None or layout.node_rank not in rejoining):
            return
        self.waiting_since = now
        ago = self.link.lost_ago
        log.info("node %d replaces a lost node: its ranks start with the round's strategy (waiting up to %.0fs, "
                 "TASKD_NODE_REJOIN_TIMEOUT)%s", layout.node_rank, self.config.node_rejoin_timeout,
                 f"; the controller declared it lost {ago:.1f}s ago" if ago is not None else "")

    def lost_at(self, now: float) -> float:
        """When this replacement's node was lost (monotonic; the controller's declaration), else `now`: its
        "training resumed N s after the fault" counts from there, as the survivors' does."""
        ago = self.link.lost_ago
        return now - ago if ago is not None else now

    def fault_ranks(self) -> dict[int, str]:
        """The round this replacement joins: every rank of its node (they never ran)."""
        return {rank.global_rank: FaultType.PROCESS for rank in self.table.all()}

    def watch(self, now: float) -> None:
        """Each turn of the loop: a replacement whose ranks started is one no more; one that waited too long gives
        up; and an agent cut off from its controller asks whether it was fenced (controller_link.py)."""
        if self.waiting_since is not None and any(r.state is not RankState.NOT_STARTED for r in self.table.all()):
            self.waiting_since = None
        if replacement_overdue(self.waiting_since, now, self.config.node_rejoin_timeout):
            log.error("the controller named no strategy for this replacement node within %.0fs "
                      "(TASKD_NODE_REJOIN_TIMEOUT): no rank started", self.config.node_rejoin_timeout)
            self.waiting_since = None
            self.finish(False, 1, f"no strategy for the replacement within {self.config.node_rejoin_timeout:.0f}s")
            return
        self.link.probe_fenced(now)


__all__ = ["NodeLoss", "StandbyEnd", "assigned_node", "await_assignment", "replacement_overdue", "standby_step"]
