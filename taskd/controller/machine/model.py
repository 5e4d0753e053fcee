"""The words the state machine is written in: a job's states, the machine's timeouts, and a round.

Everything here is data; the behaviour is in `taskd.controller.machine.table` (which handler runs for which
event in which state) and the modules it names. See docs/controller.md for the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from taskd.server_settings import server_default
from taskd.settings import default
from taskd.vocabulary import FaultRanks


class JobState(str, Enum):
    RUNNING = "RUNNING"  # training; no round open
    STOPPING = "STOPPING"  # stopTrain sent, waiting stop-complete from every agent
    COLLECTING = "COLLECTING"  # globalFault sent, waiting strategies from every agent
    RECOVERING = "RECOVERING"  # changeStrategy sent, waiting recover status from every agent
    RESUMING = "RESUMING"  # controller restarted mid-round, waiting for agents to resubscribe
    REJOINING = "REJOINING"  # a node-loss round has the survivors' strategies; waits for the lost node's replacement
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


S = JobState
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED})
LIVE = frozenset(JobState) - TERMINAL
ANY = frozenset(JobState)
ROUND_STATES = frozenset({S.STOPPING, S.COLLECTING, S.RECOVERING, S.RESUMING, S.REJOINING})
ACTIVE = LIVE - {S.RESUMING}
"""States in which an agent can be declared lost (RESUMING has its own resume timeout)."""


class Declined(Enum):
    """What a handler returns when its rule does not take the event after all (a duplicate-only rule given
    something new): the event is answered exactly as if no rule accepted it (401), and nothing changed."""

    DECLINED = "declined"


DECLINED = Declined.DECLINED


@dataclass(frozen=True)
class MachineConfig:
    """Timeouts (seconds) and policy defaults; every wait of a round is bounded by one of them."""

    stop_timeout: float = server_default("stop_timeout")
    strategy_timeout: float = server_default("strategy_timeout")
    recover_timeout: float = server_default("recover_timeout")
    resume_timeout: float = server_default("resume_timeout")
    settle_window: float = server_default("settle_window")
    default_max_restarts: int = default("max_restarts")  # the agent's setting (taskd/settings.py)
    # an agent without a signal stream (registered and never subscribed, or every agent after a controller
    # restart) that neither subscribed nor finished within this is lost
    agent_loss_timeout: float = server_default("agent_loss_timeout")
    # an agent whose stream ended and that did not resubscribe within this is lost (at most agent_loss_timeout):
    # a killed `taskd run` closes its stream at once, and its client resubscribes within ~1 s after a blip
    agent_loss_grace: float = server_default("agent_loss_grace")
    # a node-loss round waits this long for a replacement agent of the lost node (a restarted pod, a Slurm
    # step, an operator's `taskd run --node-rank R`); then the job fails. Long enough for Kubernetes to
    # reschedule a pod and pull its image, short enough that the survivors do not sit idle for long
    node_rejoin_timeout: float = default("node_rejoin_timeout")
    # nodes still unregistered this long after the job's first agent registered fail the job (torchrun's
    # rendezvous join_timeout): without it, the nodes that came would wait for the missing ones forever
    join_timeout: float = default("join_timeout")
    # a `--nnodes MIN:MAX` job whose nodes 0..MIN-1 registered starts this long after with the nodes present
    # (torchrun's rendezvous last_call_timeout; controller/nodes/resize.py `start_smaller`)
    last_call_timeout: float = default("last_call_timeout")
    # a job with no agent this long after its Init (no Register followed, or all forgotten by a reset) is
    # dropped, from memory and the state file (the controller's core applies it, not the machine)
    unregistered_job_timeout: float = server_default("unregistered_job_timeout")
    # standby agents (`taskd run --standby`) one job may have waiting at once; one more is refused 409
    max_standbys: int = server_default("max_standbys")


def loss_clock(config: MachineConfig, reason: str) -> float:
    """How long an agent without a stream has, by why it has none: "ended" (its stream ended: the grace, at
    most the loss timeout) or "silent" (registered and never subscribed, or restored after a controller restart)."""
    timeout = config.agent_loss_timeout
    return min(config.agent_loss_grace, timeout) if reason == "ended" else timeout


@dataclass
class Round:
    """One recovery round: the faults it handles and who answered what in its current phase."""

    number: int
    started_at: float
    faults: FaultRanks
    participants: set[int]  # agents the round waits for; a stop/collect timeout drops the silent ones
    broadcast_sets: list[frozenset[int]] = field(default_factory=list)  # fault sets sent, to spot stale acks
    acks: set[int] = field(default_factory=set)
    reports: dict[int, tuple[str, ...]] = field(default_factory=dict)
    statuses: set[int] = field(default_factory=set)
    excluded: dict[str, str] = field(default_factory=dict)  # strategy -> why it cannot be chosen this round
    failed: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    strategy: str = ""
    strategy_started_at: float = 0.0
    lost: dict[int, float] = field(default_factory=dict)  # nodes this round lost -> when (a node-loss round)
    # an agent reported its status without its ranks having re-formed a group with the restarted ones: the
    # recover only started processes, so it settles only when the settle window passes (Job.open_round)
    unrejoined: bool = False


@dataclass(frozen=True)
class Fence:
    """An agent identity the controller declared lost: nothing from it counts any more (answered 411)."""

    node_rank: int
    host: str
    pid: int
    lost_at: float
    by_host: str = ""  # the replacement's identity, once one registered
    by_pid: int = 0
    replaced_at: float | None = None
    standby: bool = False  # the replacement was a standby agent the controller assigned


def fault_runs(faults: FaultRanks) -> list[tuple[int, int, str]]:
    """(first, last, type) of each run of consecutive ranks of one type, sorted by rank."""
    runs: list[tuple[int, int, str]] = []
    for r, t in sorted(faults.items()):
        if runs and r == runs[-1][1] + 1 and t == runs[-1][2]:
            runs[-1] = (runs[-1][0], r, t)
        else:
            runs.append((r, r, t))
    return runs


def fmt_faults(faults: FaultRanks) -> str:
    """`rank:type,first-last:type` sorted by rank, a run of consecutive ranks of one type as one range: the form
    history records, log lines and the store's tables use. Its length grows with the runs, not the ranks: a
    fault of 100,000 ranks is `0-99999:1`, not 790 KB (issue 31, F5)."""
    return ",".join(f"{a}:{t}" if a == b else f"{a}-{b}:{t}" for a, b, t in fault_runs(faults))
