"""The strings and codes that travel on the wire, shared by every part of taskd.

They mirror ClusterD's vocabulary so that a TaskD agent and a taskd controller
(or the other way round) understand each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum


class FaultType:
    """`FaultRank.faultType` values."""

    RECOVERABLE = "0"  # on-chip memory fault, recoverable in place
    PROCESS = "1"  # process death, hang, anything else
    NETWORK = "2"

    ALL = (RECOVERABLE, PROCESS, NETWORK)


FaultRanks = dict[int, str]
"""Global rank -> `FaultType` value: the one shape fault ranks take in the agent, the client and the
controller, as on the wire (`FaultRank.rankId`, `FaultRank.faultType`)."""


def fault_ranks(ranks: Mapping[int, int | str]) -> FaultRanks:
    """Normalise TaskD-style `{rank: 0|1|2}` (ints) or wire strings to `FaultRanks`; ValueError on others."""
    out: FaultRanks = {}
    for rank, kind in ranks.items():
        text = str(kind)
        if isinstance(rank, bool) or not isinstance(rank, int) or text not in FaultType.ALL:
            raise ValueError(f"fault ({rank!r}: {kind!r}): expected an int rank and a fault type in {FaultType.ALL}")
        out[rank] = text
    return out


class SignalType:
    """`ProcessManageSignal.signalType` values."""

    STOP_TRAIN = "stopTrain"
    GLOBAL_FAULT = "globalFault"
    CHANGE_STRATEGY = "changeStrategy"
    SAVE_AND_EXIT = "saveAndExit"
    KEEP_ALIVE = "keep-alive"
    KILL_MASTER = "killMaster"
    FAULT_NODES_EXIT = "faultNodesExit"
    # taskd's own (a ClusterD agent never gets them): a lost agent that came back is told it is fenced, and a
    # standby agent is given the node rank of a lost node
    FENCED = "taskd.fenced"
    ASSIGN_NODE = "taskd.assignNode"
    MIGRATE = "taskd.migrate"  # `taskd migrate`: move a rank to a warm spare (extraParams rank, generation)


class Action:
    """`ProcessManageSignal.actions` entries."""

    STOP_TRAIN = "stop_train"
    PAUSE_TRAIN = "pause_train"
    ON_GLOBAL_RANK = "on_global_rank"
    CHANGE_STRATEGY = "change_strategy"
    SAVE_AND_EXIT = "save_and_exit"
    FAULT_NODES_EXIT = "fault_nodes_exit"
    FAULT_NODES_RESTART = "fault_nodes_restart"


class Strategy:
    """Recovery strategies, in the order the controller prefers them."""

    RETRY = "retry"  # in-process step retry
    RECOVER = "recover"  # restart only the faulty ranks
    JOB_RESCHEDULING = "job-rescheduling"  # restart every rank from checkpoint
    DUMP = "dump"  # healthy ranks save, then exit
    EXIT = "exit"

    # scale-in and scale-out (issue 17, opt-in: `taskd run --nnodes MIN:MAX` and `LiveGroup(on_resize=...)`), under
    # ClusterD's names: never in ORDER, the controller chooses them only when a lost node is not replaced in time
    # (downgrade: the job goes on without it) and when it comes back (upgrade: the job grows back to full size)
    DOWNGRADE = "downgrade"
    UPGRADE = "upgrade"

    ORDER = (RETRY, RECOVER, JOB_RESCHEDULING, DUMP, EXIT)
    TERMINAL = (DUMP, EXIT)
    RESIZE = (DOWNGRADE, UPGRADE)
    REJOIN = (RECOVER, *RESIZE)  # the ranks a live node keeps re-form their group; only some start (a joiner's)
    KNOWN = ORDER + RESIZE  # what a strategy report may name


def parse_strategies(text: str | list[str] | tuple[str, ...], known: tuple[str, ...] = Strategy.ORDER) -> list[str]:
    """Parse `recover,job-rescheduling,exit`; raise ValueError naming an unknown entry. A configuration names
    strategies of `Strategy.ORDER`; an agent's report may also offer a resize (`Strategy.KNOWN`)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item not in known:
            raise ValueError(f"unknown strategy {item!r}; known: {', '.join(known)}")
        if item not in out:
            out.append(item)
    return out


class Code(IntEnum):
    """`Status.code` values."""

    OK = 0
    NOT_REGISTERED = 400
    OUT_OF_ORDER = 401
    JOB_NOT_EXIST = 402
    RECOVERY_DISABLED = 403
    PROCESS_NOT_READY = 404
    RETRY_FAILED_RECOVERABLE = 405
    RETRY_FAILED_UNRECOVERABLE = 406
    DUMP_FAILED = 407
    NOT_INITIALISED = 408
    INVALID_PARAMS = 409
    RATE_LIMITED = 410
    FENCED = 411  # taskd: the caller is an agent the controller declared lost; its node is another's now
    QUOTA_EXCEEDED = 413  # taskd: the change would take the job past its stored-bytes quota; nothing changed
    TOO_MANY_REQUESTS = 429
    TOO_MANY_JOBS = 500
    STORAGE_ERROR = 503  # taskd: the controller could not store the change, so nothing changed; send it again later
    SIGNAL_QUEUE_BUSY = 504
    REPORT_TIMEOUT = 507


DEFAULT_PORT = 8899

STRAGGLER_MIGRATION = "straggler-"
"""The id prefix of a migration an agent started itself for a straggler (`--migrate-stragglers`); the controller's
events and metrics name the trigger by it (a `taskd migrate`'s id is its signal's uuid)."""
