"""A node's part when a node of its job is lost (issue 17; the contract is docs/architecture.md's node-loss path).

Three ways an agent meets a node loss, each apart from the recovery round it then joins as usual:

- a **replacement**: started for a node rank the controller declared lost (`taskd run --node-rank R`
  on a new host, a restarted pod). Right after registering it finds its node rank in the job's
  `rejoining` list; it starts no rank on its own and waits, bounded by TASKD_NODE_REJOIN_TIMEOUT, for
  the round's changeStrategy, which starts its ranks (they never ran: recover starts all of them in
  the order's generation, job-rescheduling starts them with everyone's);
- a **standby** (`taskd run --standby`): joins with no node (the round machine's STANDBY), waits until
  the controller assigns it a lost node's rank (`taskd.assignNode`: the machine's TakeNode) or the job
  ends (exit 0: it was not needed; `StandbyWatch` asks the job's state), then takes that node rank (the
  launcher's `set_node_rank`) and proceeds as a replacement. An agent started for a node rank that a
  replacement already holds (Kubernetes' recreated pod of a node a standby took over; registration.py)
  becomes one, as does a standby whose assigned node another replacement took first;
- a **fenced** agent: one the controller declared lost that came back (SIGSTOP/SIGCONT, a healed
  partition). Whatever said so (a 411 answer, a `taskd.fenced` signal, the answer to its own question
  when cut off), it stops every rank first, so none acts for the node again, and exits 1 with the
  controller's words naming what replaced it (the round machine's FenceOrder rule).

What each of these does next is the round machine's (agent/round/rules.py: the Began* events, STANDBY's and
REJOINING's rules); `NodeLoss` and `StandbyWatch` are the mechanics that tell it what they saw.

A survivor's console while its round waits for a lost node's replacement (issue 31, F10): `LossWait`.
A node-loss round waits up to the controller's --node-rejoin-timeout (300 s by default) for a replacement
before it goes on; the survivors printed nothing meanwhile. The round's stopTrain and globalFault say what
it waits for (extraParams "awaiting": the node ranks, "rejoin_left": seconds until the controller gives up,
"rejoin_timeout": the flag's value); `LossWait` says so once when the wait starts, then every `every(timeout)`
seconds while it lasts, and once when the round's strategy (or the job's end) ends it. Every duration is
measured on this node's clock from the moment it learned of the wait.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from taskd.agent.config import AgentConfig
from taskd.agent.link.controller import ControllerLink
from taskd.agent.link.orders import Command, Order
from taskd.agent.ranks.launcher import Launcher, NodeRankFixed
from taskd.agent.ranks.table import RankLayout, RankTable
from taskd.agent.round.events import BeganStandby, ControllerLost, Ended, JobSeen, RejoinOverdue
from taskd.agent.round.states import NodeFacts
from taskd.vocabulary import FaultType

log = logging.getLogger("taskd.agent")

JOB_POLL = 1.0  # seconds between a standby's questions whether its job still runs


def replacement_overdue(waiting_since: float | None, now: float, timeout: float) -> bool:
    """A replacement that has waited `timeout` seconds for its round's strategy gives up (its ranks never ran)."""
    return waiting_since is not None and now - waiting_since >= timeout


class JobSource(Protocol):
    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None: ...


class StandbyWatch:
    """A standby's questions to its controller, once every `JOB_POLL` s: does its job still run (`JobSeen`), and is
    the controller still answering (`ControllerLost` once it has been silent for `silence` s: a standby nobody
    can assign must not wait forever)."""

    def __init__(self, silence: float, now: float) -> None:
        self.silence = silence
        self.next_poll = now
        self.answered = now

    def poll(self, link: JobSource, clock: Callable[[], float] = time.monotonic) -> JobSeen | ControllerLost | None:
        if clock() < self.next_poll:
            return None
        answer = link.job_state(timeout=2.0)
        now = clock()
        self.next_poll = now + JOB_POLL
        if answer is not None:
            self.answered = now
            return JobSeen(*answer)
        if now - self.answered >= self.silence:
            return ControllerLost(now - self.answered)
        return None


class NodeLoss:
    """The node-loss mechanics with the agent's parts (the supervisor sequences the calls, the machine decides).

    The fence order itself is the round machine's (round/rules.py: any state, FenceOrder -> FENCED: every rank
    SIGKILLed first, then exit 1); what turns a 411 or a `taskd.fenced` into that order is link/controller.py's."""

    def __init__(self, config: AgentConfig, link: ControllerLink, table: RankTable, launcher: Launcher) -> None:
        self.config = config
        self.link = link
        self.table = table
        self.launcher = launcher
        self.standby_watch: StandbyWatch | None = None  # while a standby waits for a node

    # -- a standby -------------------------------------------------------------------------------------
    def join_as_standby(self, job_id: str, facts: NodeFacts) -> BeganStandby | Ended:
        """Join with no node: the machine's STANDBY, whose orders and `StandbyWatch` tell it what comes next."""
        per_node = self.config.ranks_per_node or 1
        if not self.link.connect(job_id, RankLayout(0, facts.node_count, tuple(range(per_node))), as_standby=True):
            refused = self.link.refusal
            return Ended(False, 1, f"the controller refused this standby: {refused}" if refused else
                         "a standby needs the job's controller, and none answered")
        log.info("standby for job %s: waiting for a lost node to take over (or the job's end)", job_id)
        self.standby_watch = StandbyWatch(self.config.controller_timeout, time.monotonic())
        return BeganStandby(facts, None)

    def wait_again(self) -> None:
        """A standby whose assigned node another replacement took first (`yield_node`) waits for the next one."""
        log.info("standby for job %s: waiting again for a lost node to take over (or the job's end)", self.link.job_id)
        self.standby_watch = StandbyWatch(self.config.controller_timeout, time.monotonic())

    def standby_poll(self) -> JobSeen | ControllerLost | None:
        return self.standby_watch.poll(self.link) if self.standby_watch is not None else None

    def yield_node(self, job_id: str, node_rank: int) -> bool:
        """Refused node `node_rank` because a replacement holds it (registration.py: the lost node's recreated pod, a
        standby that lost the race for an assigned node): True when this agent is to be a standby instead."""
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
        return True

    def take(self, node_rank: int) -> str:
        """A standby assigned `node_rank` becomes it (the launcher's node rank); "" once it is, else why not."""
        try:
            self.launcher.set_node_rank(node_rank)
        except (NodeRankFixed, ValueError, RuntimeError) as exc:
            log.error("cannot take over node %s: %s", node_rank, exc)
            return f"cannot take over node {node_rank}: {exc}"
        log.info("this standby takes over node %d", node_rank)
        self.standby_watch = None
        return ""

    # -- a replacement ------------------------------------------------------------------------------
    def is_replacement(self, layout: RankLayout, assigned: bool) -> bool:
        """Right after registering: a node rank the job's open node-loss round waits for is a replacement's (a
        standby given a node always is). It then starts no rank itself: the round's strategy does."""
        if layout.node_count <= 1 and not assigned:
            return False
        rejoining = self.link.rejoining_at_register
        if not assigned and (rejoining is None or layout.node_rank not in rejoining):
            return False
        ago = self.link.lost_ago
        log.info("node %d replaces a lost node: its ranks start with the round's strategy (waiting up to %.0fs, "
                 "TASKD_NODE_REJOIN_TIMEOUT)%s", layout.node_rank, self.config.node_rejoin_timeout,
                 f"; it was lost {ago:.1f}s ago" if ago is not None else "")
        return True

    def lost_at(self, now: float) -> float:
        """When this replacement's node was lost (monotonic; its fault, as the controller saw it), else `now`: its
        "training resumed N s after the fault" counts from there, as the survivors' does."""
        ago = self.link.lost_ago
        return now - ago if ago is not None else now

    def fault_ranks(self) -> dict[int, str]:
        """The round this replacement joins: every rank of its node (they never ran)."""
        return {rank.global_rank: FaultType.PROCESS for rank in self.table.all()}

    def watch(self, now: float, rejoining_since: float | None) -> RejoinOverdue | None:
        """Each turn of the loop: a replacement that waited too long for its strategy gives up; and an agent cut
        off from its controller asks whether it was fenced (link/controller.py)."""
        if replacement_overdue(rejoining_since, now, self.config.node_rejoin_timeout):
            return RejoinOverdue(self.config.node_rejoin_timeout)
        self.link.probe_fenced(now)
        return None


EVERY = (5.0, 30.0)
"""Seconds between two "still waiting" lines: a tenth of the rejoin timeout, within these bounds."""
ENDS = frozenset({Command.CHANGE, Command.DUMP, Command.KILL, Command.FENCE})
"""The orders that end the wait: the round's strategy, or the job's end."""


@dataclass(frozen=True)
class Awaited:
    """What a node-loss round's signal says it waits for."""

    nodes: tuple[int, ...]
    left: float  # seconds until the controller stops waiting, when it sent the signal
    timeout: float  # its --node-rejoin-timeout


def awaited(extra_params: str) -> Awaited | None:
    """The wait a signal's extraParams announce; None for any other signal (or params taskd did not write)."""
    try:
        params = json.loads(extra_params or "{}")
        nodes = tuple(int(n) for n in params["awaiting"])
        left, timeout = float(params["rejoin_left"]), float(params["rejoin_timeout"])
    except (TypeError, ValueError, KeyError, RecursionError):
        return None
    return Awaited(nodes, left, timeout) if nodes and left >= 0 and timeout > 0 else None


def every(timeout: float) -> float:
    return min(max(timeout / 10, EVERY[0]), EVERY[1])


def _nodes(nodes: tuple[int, ...]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))


class LossWait:
    """The wait of one node for the replacements its round awaits; `on_order` and `tick` from the agent's loop."""

    def __init__(self) -> None:
        self.nodes: tuple[int, ...] = ()
        self.since: float | None = None  # when this node learned of the wait (monotonic)
        self.until = 0.0  # when the controller stops waiting, on this node's clock
        self.next_at = 0.0
        self.period = EVERY[1]

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def on_order(self, order: Order, now: float, own_node: int | None = None) -> None:
        """`own_node`: this agent's node rank (a replacement is not waiting for itself)."""
        if order.command in ENDS:
            self._end(now, f"changeStrategy {order.strategy}" if order.command is Command.CHANGE and order.strategy
                      else f"{order.command.value} order")
            return
        if order.command not in (Command.STOP, Command.STRATEGIES):
            return
        wait = awaited(order.extra_params)
        if wait is not None and own_node in wait.nodes:
            wait = Awaited(tuple(n for n in wait.nodes if n != own_node), wait.left, wait.timeout)
        if wait is None or not wait.nodes:
            return
        self.until = now + wait.left
        if wait.nodes == self.nodes and self.since is not None:
            return
        self.nodes, self.period = wait.nodes, every(wait.timeout)
        if self.since is None:
            self.since = now
        self.next_at = now + self.period
        who = " or ".join(f"`taskd run --node-rank {n} ...`" for n in wait.nodes)
        log.warning("%s lost: the round waits for a replacement (%s on a new host, or a `taskd run --standby`), at "
                    "most %.0fs more (the controller's --node-rejoin-timeout is %.0fs)", _nodes(wait.nodes), who,
                    wait.left, wait.timeout)

    def tick(self, now: float) -> None:
        if self.since is None or now < self.next_at:
            return
        self.next_at = now + self.period
        log.warning("still waiting for a replacement of %s: %.0fs so far, at most %.0fs more", _nodes(self.nodes),
                    now - self.since, max(self.until - now, 0.0))

    def _end(self, now: float, what: str) -> None:
        if self.since is None:
            return
        log.info("the wait for a replacement of %s ended after %.1fs: %s", _nodes(self.nodes), now - self.since, what)
        self.since, self.nodes = None, ()


__all__ = ["JOB_POLL", "Awaited", "LossWait", "NodeLoss", "StandbyWatch", "awaited", "every", "replacement_overdue"]
