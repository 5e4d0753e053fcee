"""What goes into the state machine (events) and what comes out of it (an `Outcome`).

Events are final classes: the table looks rules up by an event's exact type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from taskd.settings import default
from taskd.vocabulary import Code, FaultRanks

# ---------------------------------------------------------------------------- events in


@dataclass(frozen=True)
class JobInit:
    node_count: int = 0
    ranks_per_node: int = 0
    max_restarts: int | None = None
    strategies: tuple[str, ...] = ()
    node_rank: int = 0
    host: str = ""
    pid: int = 0
    standby: bool = False  # a standby's Init: joins (or creates) the job, never resets it
    # the fewest nodes it may go on with after a node loss (`--nnodes MIN:MAX`, nodes/resize.py); 0 = fixed size
    min_nodes: int = default("min_nodes")


@dataclass(frozen=True)
class AgentRegistered:
    node_rank: int = 0
    role: str = ""
    host: str = ""
    pid: int = 0
    ranks_per_node: int = 0
    standby: bool = False  # a spare agent (node_rank ignored), or a standby taking the node it was assigned
    restarts_used: int = 0  # the job's restarts the agent counts (its degraded local restarts included)


@dataclass(frozen=True)
class AgentConnected:
    """The agent opened its signal stream."""

    node_rank: int = 0
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class AgentDisconnected:
    node_rank: int = 0


@dataclass(frozen=True)
class StandbyConnected:
    """A standby agent opened its signal stream (standbys have no node rank: they are known by host and pid)."""

    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class StandbyDisconnected:
    """A standby's stream ended, or (`silent`) it had none for `agent_loss_timeout`: registered and never
    subscribed, or not back after a controller restart. Either way it is forgotten."""

    host: str = ""
    pid: int = 0
    silent: float = 0.0  # seconds without a stream, for a timed-out one (0: its stream ended)


@dataclass(frozen=True)
class FaultReported:
    node_rank: int = 0
    faults: FaultRanks = field(default_factory=dict)
    detail: str = ""
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class StopComplete:
    node_rank: int = 0
    code: int = 0
    info: str = ""
    faults: FaultRanks = field(default_factory=dict)
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class StrategiesReported:
    node_rank: int = 0
    strategies: tuple[str, ...] = ()
    faults: FaultRanks = field(default_factory=dict)
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class RecoverStatusReported:
    node_rank: int = 0
    code: int = 0
    info: str = ""
    strategy: str = ""
    isolate_ranks: tuple[str, ...] = ()
    host: str = ""
    pid: int = 0
    rejoined: bool = False  # the node's ranks re-formed their group with the restarted ones (live recovery)


@dataclass(frozen=True)
class AgentFinished:
    node_rank: int = 0
    exit_code: int = 0
    message: str = ""
    host: str = ""
    pid: int = 0


@dataclass(frozen=True)
class PaceReported:
    """An agent's ranks' recent compute time per step (`taskd.pace`), judged against the job's other ranks."""

    node_rank: int = 0
    host: str = ""
    pid: int = 0
    factor: float = 0.0
    paces: tuple[tuple[int, float, int], ...] = ()  # (global rank, compute seconds per step, steps averaged)


@dataclass(frozen=True)
class TrainingResumed:
    """An agent's ranks train again after round `round` (`ResumedRequest`; taskd.controller.machine.resumed)."""

    node_rank: int = 0
    host: str = ""
    pid: int = 0
    round: int = 0
    seconds: float = 0.0  # the agent's own measure: its first sight of the fault -> training resumed
    seconds_ago: float = 0.0  # how long before the report was sent it resumed (a re-sent report is not late)
    unseen: bool = False  # nothing on that node can show it (no rank restarted there, no heartbeat steps)
    restores: tuple[tuple[int, str, int, int], ...] = ()  # (rank, source, step, steps redone or -1): issue 33


@dataclass(frozen=True)
class MigrationRequested:
    """`taskd migrate --job J --rank R` (taskd.v1 `JobControl.Migrate`)."""

    rank: int = 0
    node: int | None = None  # `--node N`: every rank of node N moves to a standby (nodes/node_migration.py)


@dataclass(frozen=True)
class MigrationReported:
    """The holding agent's account of a migration (taskd.v1 `ReportMigration`)."""

    node_rank: int = 0
    host: str = ""
    pid: int = 0
    migration: str = ""
    migrated: bool = False
    reason: str = ""
    rank: int = 0
    old_pid: int = 0
    new_pid: int = 0
    step: int = 0
    pause_seconds: float = 0.0
    resumed_seconds: float = 0.0
    generation: int = 0
    stage: str = ""  # a node migration's: "ready", "joined", "" (the successor's final account); "node": the whole


@dataclass(frozen=True)
class Tick:
    """Time passed; the machine acts if its deadline is due."""


@dataclass(frozen=True)
class AgentLossDue:
    """Time passed; agents gone longer than `agent_loss_timeout` (if any still are) are lost."""


@dataclass(frozen=True)
class StreamEndedDue:
    """Time passed; agents whose stream ended longer than `agent_loss_grace` ago (if any still are) are lost."""


@dataclass(frozen=True)
class RejoinDue:
    """Time passed; a node awaited for `node_rejoin_timeout` got no replacement."""


@dataclass(frozen=True)
class LastCallDue:
    """Time passed; a `--nnodes MIN:MAX` job's nodes 0..MIN-1 registered `last_call_timeout` ago: it starts."""


@dataclass(frozen=True)
class JoinDue:
    """Time passed; nodes still unregistered `join_timeout` after the first agent registered never joined."""


Event = (
    JobInit | AgentRegistered | AgentConnected | AgentDisconnected | FaultReported | StopComplete
    | StrategiesReported | RecoverStatusReported | AgentFinished | Tick | AgentLossDue | JoinDue | LastCallDue
    | StreamEndedDue | RejoinDue | StandbyConnected | StandbyDisconnected | PaceReported | TrainingResumed
)

EVENT_TYPES: tuple[type, ...] = (
    JobInit, AgentRegistered, AgentConnected, AgentDisconnected, FaultReported, StopComplete, StrategiesReported,
    RecoverStatusReported, AgentFinished, Tick, AgentLossDue, JoinDue, LastCallDue, StreamEndedDue, RejoinDue,
    StandbyConnected, StandbyDisconnected, PaceReported, TrainingResumed, MigrationRequested, MigrationReported,
)

FIRE_AND_FORGET = (Tick, AgentLossDue, JoinDue, StreamEndedDue, RejoinDue, AgentDisconnected, StandbyDisconnected)
"""Events nobody waits an answer for: when no rule takes them they are dropped, not answered 401."""

NEEDS_REGISTERED = frozenset({
    AgentConnected, FaultReported, StopComplete, StrategiesReported, RecoverStatusReported, AgentFinished,
    PaceReported, TrainingResumed, MigrationReported,
})
"""Reports that must come from an agent the job knows (Register), else 400."""

# ---------------------------------------------------------------------------- effects out


@dataclass(frozen=True)
class Signal:
    """A ProcessManageSignal for every agent of the job (or one agent when re-sent)."""

    uuid: str
    signal_type: str
    actions: tuple[str, ...]
    faults: tuple[tuple[int, str], ...] = ()
    strategy: str = ""
    timeout: int = 0
    reason: str = ""  # why the job is ending (exit, killMaster): travels as extraParams {"reason": ...}
    nodes: tuple[int, ...] = ()  # the nodes the faulty ranks live on (nodeRankIds on the wire)
    # the job's signal number: a changeStrategy's live-recovery generation (the same on every node, never
    # repeated while the job lives, persisted as `signal_seq`), extraParams {"generation": ...}
    generation: int = 0
    restarts: int = 0  # the job's restarts used when it was made, this round's charge included
    round: int = 0  # the job's round it belongs to: a changeStrategy's extraParams {"round": ...} (ResumedRequest)
    extra: tuple[tuple[str, object], ...] = ()  # more extraParams (taskd.assignNode's {"node_rank": R})


T = TypeVar("T")


class _once(Generic[T]):
    """`functools.cached_property` without the lock it takes on every first read before Python 3.12 (one RLock
    shared by every instance of the class): the value goes into the instance's __dict__, where every later read
    finds it without reaching here. For values that are a pure function of a frozen instance."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class Record:
    """One entry of the job's event history."""

    kind: str
    round: int
    detail: dict[str, Any]

    @_once
    def detail_json(self) -> str:
        """The detail as the state file stores it (sorted keys), encoded once: the quota counts it twice (the
        refusal and the charge) and the store writes it, three encodings per record before."""
        return _SORTED_JSON.encode(self.detail)


_SORTED_JSON = json.JSONEncoder(sort_keys=True)
"""What `json.dumps(d, sort_keys=True)` uses, made once: dumps builds an encoder per call for any option."""


@dataclass
class Outcome:
    """The answer to one event: status for the caller, signals to send, history to persist."""

    code: int = Code.OK
    info: str = ""
    signals: list[Signal] = field(default_factory=list)  # to every agent of the job
    direct: list[Signal] = field(default_factory=list)  # only to the agent that caused the event
    # to one standby's stream, by (host, pid); None closes that stream (the standby became a node)
    to_standbys: list[tuple[tuple[str, int], Signal | None]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    agents_changed: set[int] = field(default_factory=set)
    settled: MigrationReported | None = None  # how a migration ended: the `Migrate` call waiting on it is answered
