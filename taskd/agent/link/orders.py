"""The controller's orders as the agent reads them: one `Command` per signal or action, and its `Order`.

Apart from the link (agent/link/controller.py) so that the round machine, which reads orders, imports no
gRPC: an `Order` is built from a signal's fields alone (`Order.of` takes any object that has them).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from taskd.agent.ranks.resize import Resize
from taskd.vocabulary import Action, FaultRanks, SignalType, fault_ranks

log = logging.getLogger("taskd.agent")


class Command(str, Enum):
    """What the controller asks of this agent, whatever signal or action carried it."""

    STOP = "stop"  # stop the fault ranks, report stop complete
    STRATEGIES = "strategies"  # report the strategies this agent offers
    CHANGE = "change"  # carry out the chosen strategy
    DUMP = "dump"  # healthy ranks save, then the job ends
    KILL = "kill"  # the job ends now
    FENCE = "fence"  # this agent was declared lost and replaced: stop every rank, exit 1 (issue 17)
    ASSIGN = "assign"  # a standby takes over a lost node's rank (issue 17)
    MIGRATE = "migrate"  # move a rank to a warm spare at the next step boundary (`taskd migrate`; ranks/migration.py)


# The wire's actions and signal types -> commands (the client dispatches on these names).
WIRE_COMMANDS = {
    Action.STOP_TRAIN: Command.STOP, Action.ON_GLOBAL_RANK: Command.STRATEGIES,
    Action.CHANGE_STRATEGY: Command.CHANGE, Action.SAVE_AND_EXIT: Command.DUMP,
    Action.FAULT_NODES_EXIT: Command.KILL, SignalType.KILL_MASTER: Command.KILL,
    SignalType.FENCED: Command.FENCE, SignalType.ASSIGN_NODE: Command.ASSIGN, SignalType.MIGRATE: Command.MIGRATE,
}


@dataclass(frozen=True)
class Order:
    """One command from the controller, as the agent's handlers read it.

    `generation`, `restarts` and `round` are taskd's controller's (a changeStrategy's extraParams JSON: the live
    generation every node names, the job's restarts used with this round's charge, the round), parsed once here
    and None when absent or not a non-negative int (ClusterD sends none)."""

    command: Command
    uuid: str
    signal_type: str
    actions: tuple[str, ...]
    fault_ranks: FaultRanks
    strategy: str
    timeout: float
    extra_params: str
    generation: int | None = None
    restarts: int | None = None
    node_rank: int | None = None  # an assignNode's (extraParams {"node_rank": R}, issue 17)
    resize: Resize | None = None  # a downgrade's or upgrade's group (extraParams world_size and rank_map)
    round: int | None = None  # the controller's round: named when telling it training resumed (ResumedRequest)
    # a node-loss round's stopTrain: seconds from the lost node's fault (its stream's end, or last word) to the
    # signal, so that "training resumed N s after the fault" counts from the fault, not from its declaration
    fault_ago: float | None = None
    rank: int | None = None  # a taskd.migrate's rank to move (extraParams {"rank": R})
    stage: str = ""  # a node migration's taskd.migrate (extraParams {"stage": ...}; agent/ranks/node_migration.py)
    migration: str = ""  # and the migration it belongs to (extraParams {"migration": ...}; "" in its first order)

    @classmethod
    def of(cls, command: Command, sig: Any) -> Order:
        raw = dict(sig.fault_ranks or {})
        try:
            faults = fault_ranks(raw)
        except ValueError as exc:  # a fault type taskd does not know: keep it as the controller sent it
            log.debug("signal %s: %s", sig.uuid, exc)
            faults = {int(r): str(t) for r, t in raw.items()}
        params = _params(sig.extra_params)
        return cls(command, sig.uuid, sig.signal_type, tuple(sig.actions), faults, sig.strategy,
                   float(sig.timeout or 0), sig.extra_params, _count(params, "generation"), _count(params, "restarts"),
                   _count(params, "node_rank"), Resize.parse(params), _count(params, "round"),
                   _seconds(params, "fault_ago"), _count(params, "rank"), _word(params, "stage"),
                   _word(params, "migration", 256))

    def reason(self) -> str:
        """taskd's controller says why it ends a job in extraParams {"reason": ...}; ClusterD sends other JSON."""
        return str(_params(self.extra_params).get("reason", ""))


def _params(extra_params: Any) -> dict[str, Any]:
    """A signal's extraParams as a JSON object; {} for anything else (ClusterD's, malformed, hostile)."""
    try:
        params = json.loads(extra_params or "{}")
    except (TypeError, ValueError, RecursionError):
        return {}
    return params if isinstance(params, dict) else {}


def _count(params: dict[str, Any], name: str) -> int | None:
    """A non-negative int field of extraParams, or None (missing, a bool, a float, a string, negative)."""
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _word(params: dict[str, Any], name: str, most: int = 32) -> str:
    """A short string field of extraParams, or "" (missing, not a string, longer than `most` characters)."""
    value = params.get(name)
    return value if isinstance(value, str) and len(value) <= most else ""


def _seconds(params: dict[str, Any], name: str, most: float = 86400.0) -> float | None:
    """A number of seconds in [0, most] from extraParams, or None (missing, a bool, out of range, not finite)."""
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
        return None
    return float(value)


__all__ = ["WIRE_COMMANDS", "Command", "Order"]
