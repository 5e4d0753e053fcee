"""The agent's round: the states a node goes through in a recovery, and the data the machine keeps.

Pure data: what the handlers (agent/round/handlers.py) read and change. The rank table is read through
`NodeView`, never changed here: processes are the mechanics' (agent/round/actions.py).

What the agent decides on its own, apart from how it carries it out, is here too, pure, clock passed in:
the controller decides recoveries; the agent decides only what it must when the controller cannot: when
to stop waiting for a lost controller (`LossTimer`, degraded mode), the degraded-mode budget and the
dump's deadline (`LocalPolicy`). When to re-send a report is agent/link/report_policy.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from taskd.settings import default
from taskd.vocabulary import FaultRanks


class NodeState(str, Enum):
    """Where this node stands in the job's recovery."""

    RUNNING = "RUNNING"  # no round
    REPORTING = "REPORTING"  # a fault seen here, its report not yet taken by the controller
    STOPPING = "STOPPING"  # the controller's round is open: its fault ranks stopped here, waiting for its strategy
    RESTARTING = "RESTARTING"  # ranks being started (the launcher's result is the next event)
    REBUILDING = "REBUILDING"  # a live group re-forming; the controller waits for this node's status
    RESUMING = "RESUMING"  # the round's restart is done: waiting to see training resume
    DEGRADED = "DEGRADED"  # no controller: faults restart this (single-node) job's ranks locally
    STANDBY = "STANDBY"  # a spare node: no ranks, waiting to be assigned a lost node's rank
    REJOINING = "REJOINING"  # replacing a lost node: no rank starts before the round's changeStrategy
    FENCED = "FENCED"  # declared lost and replaced: every rank stopped, the agent exits 1
    ENDED = "ENDED"  # the job ended on this node


S = NodeState
TERMINAL = frozenset({S.FENCED, S.ENDED})
ANY = frozenset(NodeState) - TERMINAL
WITH_RANKS = ANY - {S.STANDBY, S.REJOINING}  # states in which this node's ranks have been started


DUMP_SHARE = 0.8  # of the controller's save deadline: leave it time to hear the result
DUMP_MIN = 1.0  # seconds, however short the controller's deadline


@dataclass
class LocalPolicy:
    """The degraded-mode budget and the agent's own deadlines for one job."""

    max_restarts: int
    controller_timeout: float
    dump_timeout: float
    restarts_used: int = 0
    degraded: bool = False  # no controller: faults are recovered locally

    def spend_restart(self) -> int | None:
        """Take one local restart from the budget: its number (1-based), or None when the budget is spent."""
        if self.restarts_used >= self.max_restarts:
            return None
        self.restarts_used += 1
        return self.restarts_used

    def dump_budget(self, signal_timeout: float | None) -> float:
        """How long ranks may take to save: ours, shortened to 80% of the controller's deadline if it sent one."""
        budget = self.dump_timeout
        if signal_timeout and signal_timeout > 0:
            budget = min(budget, max(DUMP_MIN, signal_timeout * DUMP_SHARE))
        return budget


class NodeView(Protocol):
    """What the machine reads of the node's ranks (the rank table and the live ranks' declarations)."""

    def local_of(self, faults: FaultRanks) -> list[int]: ...  # this node's local ranks among `faults`

    def local_ranks(self) -> list[int]: ...

    def live_fault(self, local_rank: int, faults: FaultRanks) -> bool: ...  # a live rank paused in place: keep it


@dataclass(frozen=True)
class NodeFacts:
    """What the machine knows of the node for the whole job."""

    node_count: int = 1  # a multi-node job never recovers without its controller
    live: bool = False  # the launcher gives ranks live recovery (a control file)
    controller_timeout: float = default("controller_timeout")  # named in the line that says why degraded mode started


@dataclass(frozen=True)
class RestartPlan:
    """The restart the machine ordered, until the launcher and the ranks say how it went."""

    strategy: str
    faults: FaultRanks
    started: float  # the round's start (monotonic): its records measure from the fault
    degraded: bool = False
    round: int | None = None  # the controller's round (Order.round): named when telling it training resumed
    restarted: set[int] = field(default_factory=set, compare=False)  # ranks started again into it (ended stuck)


@dataclass
class NodeRound:
    """The machine's data: the state, the round in progress, the job's restart count as last known."""

    facts: NodeFacts
    view: NodeView
    state: NodeState = S.RUNNING
    faults: FaultRanks = field(default_factory=dict)  # the round's fault ranks seen since it opened
    started: float | None = None  # when it opened (monotonic)
    charged: bool = False  # this round's restart was counted (a failed recover + job-rescheduling: one)
    restarts: int = 0  # the job's restarts used: the controller's count (Order.restarts) when it sends one
    plan: RestartPlan | None = None  # the restart in progress
    budget: LocalPolicy = field(default_factory=lambda: LocalPolicy(3, 0.0, 0.0))  # degraded mode's
    node_rank: int | None = None  # the node this agent holds; None before it began, and while a standby
    rejoin_since: float | None = None  # when this replacement began to wait for its round's strategy (monotonic)

    @property
    def standby(self) -> bool:
        """A spare holding no node: the one answer to "is this agent a standby?"."""
        return self.state is NodeState.STANDBY

    @property
    def degraded(self) -> bool:
        return self.budget.degraded

    def add_faults(self, faults: FaultRanks, now: float, keep_known: bool = False) -> None:
        for rank, fault_type in faults.items():
            if keep_known:
                self.faults.setdefault(rank, fault_type)
            else:
                self.faults[rank] = fault_type
        if self.started is None or now < self.started:  # the round's recovery counts from its earliest fault
            self.started = now

    def close(self) -> None:
        self.faults = {}
        self.started = None
        self.charged = False


@dataclass
class LossTimer:
    """A recovery round waits on the controller's next signal; a controller gone for `timeout` never sends it."""

    timeout: float
    lost_since: float | None = None

    def expired(self, now: float, waiting_on_lost_controller: bool) -> float | None:
        """Seconds the controller has been lost once that reaches `timeout` (then the timer restarts), else None."""
        if not waiting_on_lost_controller:
            self.lost_since = None
            return None
        if self.lost_since is None:
            self.lost_since = now
            return None
        lost_for = now - self.lost_since
        if lost_for < self.timeout:
            return None
        self.lost_since = None
        return lost_for


__all__ = ["ANY", "TERMINAL", "WITH_RANKS", "LocalPolicy", "LossTimer", "NodeFacts", "NodeRound", "NodeState",
           "NodeView", "RestartPlan"]
