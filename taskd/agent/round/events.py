"""What goes into the agent's round machine (events) and what comes out (actions), as small named types.

Events are facts the mechanics saw: a rank's fault, an order from the controller, a timer that expired, what
the launcher or the ranks' files said. Actions are what the machine asks the mechanics to do (agent/round/actions.py
carries them out). Neither holds a process, a socket or a clock: the machine is driven by these alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from taskd.agent.link.orders import Command, Order
from taskd.agent.ranks.resize import Resize
from taskd.agent.round.states import NodeFacts
from taskd.vocabulary import FaultRanks

# ------------------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class RankFault:
    """A rank of this node failed: exited non-zero, hung, never started, or (fault type "0") raised a
    retryable error and waits, alive, to redo its step."""

    global_rank: int
    local_rank: int
    fault_type: str
    detail: str = ""
    unseen: float = 0.0  # seconds the fault went on before it was seen: a hang's, since its last heartbeat
    stuck: bool = False  # a live rank that ended itself left blocked in its broken group (STUCK_EXIT): a survivor


@dataclass(frozen=True)
class OrderEvent:
    """An order from the controller; one subclass per `Command`, so the table can tell them apart."""

    order: Order


class StopOrder(OrderEvent):
    """stopTrain: stop the round's fault ranks of this node, report stop complete."""


class StrategiesOrder(OrderEvent):
    """globalFault: report what this node offers for the round."""


class ChangeOrder(OrderEvent):
    """changeStrategy: carry out the strategy the controller chose."""


class DumpOrder(OrderEvent):
    """saveAndExit: healthy ranks save, then the job ends."""


class KillOrder(OrderEvent):
    """killMaster / fault_nodes_exit: the job ends now."""


class FenceOrder(OrderEvent):
    """taskd.fenced (or a 411 answer): this agent was declared lost and its node is held by another."""


class AssignOrder(OrderEvent):
    """taskd.assignNode: a standby takes over a lost node's rank."""


class MigrateOrder(OrderEvent):
    """taskd.migrate: move a rank of this node to a warm spare at the next step boundary (`taskd migrate`)."""


ORDER_EVENTS: dict[Command, type[OrderEvent]] = {
    Command.STOP: StopOrder, Command.STRATEGIES: StrategiesOrder, Command.CHANGE: ChangeOrder,
    Command.DUMP: DumpOrder, Command.KILL: KillOrder, Command.FENCE: FenceOrder, Command.ASSIGN: AssignOrder,
    Command.MIGRATE: MigrateOrder,
}


def order_event(order: Order) -> OrderEvent:
    return ORDER_EVENTS[order.command](order)


@dataclass(frozen=True)
class ReportSettled:
    """The fault report left the outbox: taken by the controller, or not within the controller timeout."""

    taken: bool


@dataclass(frozen=True)
class ControllerLost:
    """Timer: the round waits on a controller that has been gone for the controller timeout."""

    lost_for: float


@dataclass(frozen=True)
class StartResult:
    """The launcher's answer to `StartRanks`. Ranks already gone when it returned come as their own
    events right after this one, never inside its handler."""

    code: int
    message: str = ""


@dataclass(frozen=True)
class GroupRejoined:
    """Every local rank rejoined the live group of the generation being rebuilt."""

    generation: int
    started: float  # the rebuild's fault (monotonic)


@dataclass(frozen=True)
class GroupFailed:
    """The live group did not re-form: a rank ended first, or the rebuild deadline passed (`detail` says)."""

    detail: str


@dataclass(frozen=True)
class Resumed:
    """The restarted ranks are training again (each reported a step of its new incarnation), or (`seen` False)
    nothing can tell: no rank of this node was restarted, or the ranks write no heartbeat steps."""

    seen: bool = True
    seconds: float = 0.0  # from the round's fault to training resumed, as the agent's line says
    at: float = 0.0  # when it was seen (monotonic)
    restores: tuple[object, ...] = ()  # where the restarted ranks restored from (snapshot_account.Restored each)


# ------------------------------------------------------------------------------------------------ a node's life
# How the node's life begins (after it registered, or failed to), and how it ends when no order ends it.


@dataclass(frozen=True)
class Began:
    """The node joined its job: `facts` what it knows of the job, `node_rank` the node it holds."""

    facts: NodeFacts
    node_rank: int | None


class BeganFirst(Began):
    """Registered as its node, the job's first start: every rank starts now."""


class BeganDegraded(Began):
    """No controller took this single-node job's agent: it starts its ranks and recovers alone."""


@dataclass(frozen=True)
class BeganReplacement(Began):
    """Registered for a lost node (or a standby given one): no rank starts before the round's changeStrategy."""

    faults: FaultRanks = field(default_factory=dict)  # every rank of its node: they never ran
    lost_at: float = 0.0  # when the node was lost (monotonic): the round counts from there


class BeganStandby(Began):
    """Joined as a spare: no node, no rank, until the controller assigns it a lost node's rank."""


@dataclass(frozen=True)
class SuccessorJoined:
    """A standby's node migration is done: it holds node `node_rank`, whose ranks run already (node_migration.py)."""

    node_rank: int


@dataclass(frozen=True)
class SuccessorGaveUp:
    """A standby's node migration was called off while it prepared the node (its ranks stopped, its node given
    back): `reason` says why."""

    reason: str


@dataclass(frozen=True)
class JobSeen:
    """A standby asked its job's state: SUCCEEDED or FAILED end its wait, "" says the controller forgot the job."""

    state: str
    info: str = ""


@dataclass(frozen=True)
class RejoinOverdue:
    """Timer: a replacement waited `timeout` seconds (TASKD_NODE_REJOIN_TIMEOUT) for its round's strategy."""

    timeout: float


@dataclass(frozen=True)
class Signalled:
    """The agent received SIGTERM or SIGINT."""

    signum: int
    name: str


@dataclass(frozen=True)
class Ended:
    """The job ends on this node for a reason no order gave: every rank succeeded, the agent failed, a setup step
    failed (no controller, a join timeout, a refusal)."""

    succeeded: bool
    exit_code: int
    reason: str


EVENT_TYPES: tuple[type, ...] = (RankFault, *ORDER_EVENTS.values(), ReportSettled, ControllerLost, StartResult,
                                 GroupRejoined, GroupFailed, Resumed, BeganFirst, BeganDegraded, BeganReplacement,
                                 BeganStandby, SuccessorJoined, SuccessorGaveUp, JobSeen, RejoinOverdue, Signalled,
                                 Ended)

# ------------------------------------------------------------------------------------------------ actions


@dataclass(frozen=True)
class Note:
    """A line for the agent's console (the machine does no I/O, logging included)."""

    level: int
    text: str


@dataclass(frozen=True)
class StopRanks:
    """Stop these local ranks (None: every rank), gracefully (SIGTERM, grace, SIGKILL) or at once."""

    local: tuple[int, ...] | None
    graceful: bool


@dataclass(frozen=True)
class StartRanks:
    """Stop, then start these local ranks again (None: every rank, START_ALL_WORKER). The launcher's result
    comes back as `StartResult`."""

    local: tuple[int, ...] | None


@dataclass(frozen=True)
class SetRestartCount:
    """Ranks started from now on get this job-wide restart count (TASKD_RESTART_COUNT, TORCHELASTIC_...)."""

    restarts: int


@dataclass(frozen=True)
class Supersede:
    """A new order replaces what the last recovery still waited for: its rebuild, and (`restart`) its resumption."""

    restart: bool = True


@dataclass(frozen=True)
class BeginRebuild:
    """Live recovery: name the generation (the controller's, else the next of this node's own) and write
    the control file for the ranks; the rebuild's progress comes back as GroupRejoined/GroupFailed/Resumed."""

    strategy: str
    faults: FaultRanks
    started: float
    timeout: float
    generation: int | None
    resize: Resize | None = None  # a downgrade's or upgrade's group size and rank map (Order.resize)


@dataclass(frozen=True)
class LeaveGroup:
    """Live: a rank of the ranks' group is gone (dead, hung and killed, or on a lost node), so the group is
    broken: every local rank leaves it now, not when the failure has travelled gloo's ring to it."""


@dataclass(frozen=True)
class PrepareReplacement:
    """Live: start this dead local rank's replacement now (a warm spare), so that it builds its model while the
    controller decides; a recover's START adopts it, any other outcome discards it (agent/ranks/live.py)."""

    local_rank: int
    faults: FaultRanks = field(default_factory=dict)


@dataclass(frozen=True)
class AbandonRebuild:
    """The rebuild in progress will never be confirmed."""


@dataclass(frozen=True)
class SendReport:
    """One report to the controller (each a pending item its loop polls, agent/link/reports.py)."""

    kind: str  # FAULT, STOP_COMPLETE, STRATEGIES, STATUS
    faults: FaultRanks = field(default_factory=dict)
    detail: str = ""  # a fault's description, a status's message
    code: int = 0  # a status's
    strategy: str = ""  # a status's
    rejoined: bool = False  # a status's: the node's ranks re-formed their group with the restarted ones (live)


FAULT, STOP_COMPLETE, STRATEGIES, STATUS = "fault", "stop complete", "strategies", "status"


@dataclass(frozen=True)
class WithdrawReports:
    """A stopTrain means the controller is (again) in a round's stop phase, where it takes no strategies and no
    recover status (401 until the stop complete is in), so reports of either still pending would be retried to
    their deadline ahead of the new stop complete. Strategies answer a collection that stopTrain ended (a fault
    joined the round: the next globalFault asks again); a recover status belongs to a round the controller moved
    past (it re-runs a round a restart caught undecided: issue 31, F2). Both are dropped."""

    kinds: tuple[str, ...] = (STRATEGIES, STATUS)  # SendReport kinds


@dataclass(frozen=True)
class OfferStrategies:
    """Report what this node offers for the round: the configured strategies this node's ranks allow for `scope`
    (recover only if every rank declared it can rejoin, retry only for type-"0" faults), for `faults`."""

    faults: FaultRanks
    scope: FaultRanks


@dataclass(frozen=True)
class RecordRestart:
    """The round's restart is done (ranks replaced, or a live group re-formed): one console and summary record;
    the round closes. Training's resumption is still to be seen (it comes as `Resumed`)."""

    strategy: str
    ranks: tuple[int, ...]
    started: float
    degraded: bool = False
    generation: int | None = None  # a live rebuild's, once every local rank rejoined


@dataclass(frozen=True)
class TellResumed:
    """Tell the controller this node's ranks train again after its round `round` (after the node's recover
    status, which the report queue sends first), or (`seen` False) that nothing here can tell."""

    round: int
    seconds: float
    at: float  # monotonic: the report says how long before it was sent
    seen: bool = True
    restores: tuple[object, ...] = ()  # the restarted ranks' sources, for the round's account (as Resumed's)


@dataclass(frozen=True)
class Dump:
    """Ask every healthy rank to save at its next step boundary, wait (bounded), stop every rank, report."""

    faults: FaultRanks
    timeout: float


@dataclass(frozen=True)
class TakeNode:
    """A standby takes over node rank `node_rank`: lays out its ranks and registers as it. What came of it is the
    next event: began as a replacement, ended (refused), or nothing (another agent took the node first: it
    waits again)."""

    node_rank: int


@dataclass(frozen=True)
class StartMigration:
    """Start a planned migration beside the round machine (ranks/migration.py), or, with `refused`, say why not."""

    order: Order
    refused: str = ""


@dataclass(frozen=True)
class StartJob:
    """The job's first start on this node: every rank; the ranks that never started, or already ended, are judged
    next like any exit."""


@dataclass(frozen=True)
class Finish:
    """The job ends on this node: every rank stopped, the agent exits with `exit_code` (None: the failing rank's)."""

    succeeded: bool
    reason: str
    exit_code: int | None = None


Action = (Note | StopRanks | StartRanks | SetRestartCount | Supersede | BeginRebuild | LeaveGroup | AbandonRebuild
          | PrepareReplacement | SendReport | WithdrawReports
          | OfferStrategies | RecordRestart | TellResumed | Dump | TakeNode | StartMigration | StartJob | Finish)
ACTION_TYPES: tuple[type, ...] = get_args(Action)  # each has one executor (agent/round/actions.py, checked at import)
