"""The per-job recovery state machine of DESIGN.md ("One fault, end to end").

It is a pure object: events go in (with the current time passed by the caller), an
`Outcome` comes out (the status to answer, signals to broadcast, events to record,
agents whose record changed) and `deadline` says when the caller must deliver the next
`Tick`. No I/O, no clock, no randomness: the gRPC layer, the store and the timer stay
thin, and the whole policy is testable without sockets.

The behaviour is the table `RULES` at the bottom: (source states, event, possible target
states, handler). An event that no rule accepts in the current state is answered 401 with
an info naming the state and the state(s) that would accept it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from taskd.vocabulary import Action, Code, FaultType, SignalType, Strategy


class JobState(str, Enum):
    RUNNING = "RUNNING"  # training; no round open
    STOPPING = "STOPPING"  # stopTrain sent, waiting stop-complete from every agent
    COLLECTING = "COLLECTING"  # globalFault sent, waiting strategies from every agent
    RECOVERING = "RECOVERING"  # changeStrategy sent, waiting recover status from every agent
    RESUMING = "RESUMING"  # controller restarted mid-round, waiting for agents to resubscribe
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


S = JobState
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED})
LIVE = frozenset(JobState) - TERMINAL
ANY = frozenset(JobState)
ROUND_STATES = frozenset({S.STOPPING, S.COLLECTING, S.RECOVERING, S.RESUMING})
ACTIVE = LIVE - {S.RESUMING}
"""States in which a lost agent fails the job (RESUMING has its own resume timeout)."""

RESTARTING = frozenset({Strategy.RECOVER, Strategy.JOB_RESCHEDULING})
"""Strategies that restart processes and so spend the restart budget."""

IN_PLACE = frozenset({Strategy.RETRY, Strategy.RECOVER})
"""Strategies that keep healthy ranks alive; excluded when the round lost track of an agent."""


@dataclass(frozen=True)
class MachineConfig:
    """Timeouts (seconds) and policy defaults; every wait of a round is bounded by one of them."""

    stop_timeout: float = 60.0
    strategy_timeout: float = 60.0
    recover_timeout: float = 300.0
    resume_timeout: float = 120.0
    settle_window: float = 30.0
    default_max_restarts: int = 3
    # an agent whose stream closed and that neither resubscribed nor finished within this fails its job
    agent_loss_timeout: float = 30.0


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


@dataclass(frozen=True)
class AgentRegistered:
    node_rank: int = 0
    role: str = ""
    host: str = ""
    pid: int = 0
    ranks_per_node: int = 0


@dataclass(frozen=True)
class AgentConnected:
    """The agent opened its signal stream."""

    node_rank: int = 0


@dataclass(frozen=True)
class AgentDisconnected:
    node_rank: int = 0


@dataclass(frozen=True)
class FaultReported:
    node_rank: int = 0
    faults: Mapping[int, str] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True)
class StopComplete:
    node_rank: int = 0
    code: int = 0
    info: str = ""
    faults: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategiesReported:
    node_rank: int = 0
    strategies: tuple[str, ...] = ()
    faults: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecoverStatusReported:
    node_rank: int = 0
    code: int = 0
    info: str = ""
    strategy: str = ""
    isolate_ranks: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentFinished:
    node_rank: int = 0
    exit_code: int = 0
    message: str = ""


@dataclass(frozen=True)
class Tick:
    """Time passed; the machine acts if its deadline is due."""


@dataclass(frozen=True)
class AgentLossDue:
    """Time passed; agents gone longer than `agent_loss_timeout` (if any still are) are lost."""


Event = (
    JobInit | AgentRegistered | AgentConnected | AgentDisconnected | FaultReported | StopComplete
    | StrategiesReported | RecoverStatusReported | AgentFinished | Tick | AgentLossDue
)

FIRE_AND_FORGET = (Tick, AgentLossDue, AgentDisconnected)
"""Events nobody waits an answer for: when no rule takes them they are dropped, not answered 401."""

# A report must come from an agent the job knows (Register), else 400.
NEEDS_REGISTERED = (
    AgentConnected, FaultReported, StopComplete, StrategiesReported, RecoverStatusReported, AgentFinished
)

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


@dataclass(frozen=True)
class Record:
    """One entry of the job's event history."""

    kind: str
    round: int
    detail: dict[str, Any]


@dataclass
class Outcome:
    code: int = Code.OK
    info: str = ""
    signals: list[Signal] = field(default_factory=list)  # to every agent of the job
    direct: list[Signal] = field(default_factory=list)  # only to the agent that caused the event
    records: list[Record] = field(default_factory=list)
    agents_changed: set[int] = field(default_factory=set)


# ---------------------------------------------------------------------------- job model


class AgentInfo:
    """One agent of a job. The flags the machine counts are properties: setting one keeps the owning
    job's indexes (online/subscribed/finished counts, (host, pid) lookup, loss heap) in step, so every
    per-agent event is O(1) however many agents the job has."""

    __slots__ = ("node_rank", "role", "ranks_per_node", "registered_at", "last_seen", "_host", "_pid", "_online",
                 "_subscribed", "_finished", "_exit_code", "_gone_since", "_owner")

    def __init__(self, node_rank: int, role: str = "", host: str = "", pid: int = 0, ranks_per_node: int = 0,
                 registered_at: float = 0.0, last_seen: float = 0.0, online: bool = False, subscribed: bool = False,
                 finished: bool = False, exit_code: int = 0, gone_since: float | None = None) -> None:
        self._owner: JobMachine | None = None
        self.node_rank = node_rank
        self.role = role
        self.ranks_per_node = ranks_per_node
        self.registered_at = registered_at
        self.last_seen = last_seen
        self._host, self._pid = host, pid
        # registered or subscribed since this controller started, stream not closed
        self._online = online
        self._subscribed = subscribed
        self._finished, self._exit_code = finished, exit_code
        # without a signal stream since (registered, stream closed, controller restart)
        self._gone_since = gone_since

    def copy(self) -> AgentInfo:
        return AgentInfo(self.node_rank, self.role, self._host, self._pid, self.ranks_per_node, self.registered_at,
                         self.last_seen, self._online, self._subscribed, self._finished, self._exit_code,
                         self._gone_since)

    def __repr__(self) -> str:
        return (f"AgentInfo(node_rank={self.node_rank}, host={self._host!r}, pid={self._pid}, online={self._online}, "
                f"subscribed={self._subscribed}, finished={self._finished}, exit_code={self._exit_code}, "
                f"gone_since={self._gone_since})")

    @property
    def host(self) -> str:
        return self._host

    @host.setter
    def host(self, value: str) -> None:
        self._set_identity(value, self._pid)

    @property
    def pid(self) -> int:
        return self._pid

    @pid.setter
    def pid(self, value: int) -> None:
        self._set_identity(self._host, value)

    def _set_identity(self, host: str, pid: int) -> None:
        if (host, pid) == (self._host, self._pid):
            return
        owner = self._owner
        if owner is not None:
            owner._index_identity(self, add=False)
        self._host, self._pid = host, pid
        if owner is not None:
            owner._index_identity(self, add=True)

    @property
    def online(self) -> bool:
        return self._online

    @online.setter
    def online(self, value: bool) -> None:
        if value != self._online:
            self._online = value
            if self._owner is not None:
                self._owner.online_count += 1 if value else -1

    @property
    def subscribed(self) -> bool:
        return self._subscribed

    @subscribed.setter
    def subscribed(self, value: bool) -> None:
        if value != self._subscribed:
            self._subscribed = value
            if self._owner is not None and self._owner._expected(self.node_rank):
                self._owner.subscribed_count += 1 if value else -1

    @property
    def finished(self) -> bool:
        return self._finished

    @finished.setter
    def finished(self, value: bool) -> None:
        self._set_finish(value, self._exit_code)

    @property
    def exit_code(self) -> int:
        return self._exit_code

    @exit_code.setter
    def exit_code(self, value: int) -> None:
        self._set_finish(self._finished, value)

    @property
    def finished_ok(self) -> bool:
        return self._finished and self._exit_code == 0

    def _set_finish(self, finished: bool, exit_code: int) -> None:
        before = self.finished_ok
        self._finished, self._exit_code = finished, exit_code
        after = self.finished_ok
        if before != after and self._owner is not None and self._owner._expected(self.node_rank):
            self._owner.finished_ok_count += 1 if after else -1
        if not finished and self._gone_since is not None and self._owner is not None:
            self._owner._push_gone(self._gone_since, self.node_rank)  # gone again counts for the loss clock

    @property
    def gone_since(self) -> float | None:
        return self._gone_since

    @gone_since.setter
    def gone_since(self, value: float | None) -> None:
        self._gone_since = value
        if value is not None and self._owner is not None:
            self._owner._push_gone(value, self.node_rank)


@dataclass
class Round:
    number: int
    started_at: float
    faults: dict[int, str]
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

    @property
    def decided(self) -> bool:
        return bool(self.strategy)


Handler = Callable[["JobMachine", Any, float, Outcome], JobState]


@dataclass(frozen=True)
class Rule:
    sources: frozenset[JobState]
    event: type
    targets: frozenset[JobState]
    handler: Handler


def _fmt_faults(faults: Mapping[int, str]) -> str:
    return ",".join(f"{r}:{t}" for r, t in sorted(faults.items()))


class JobMachine:
    """Recovery state of one job. Drive it with `handle(event, now)`."""

    def __init__(self, job_id: str, config: MachineConfig, now: float, init: JobInit | None = None) -> None:
        self.job_id = job_id
        self.config = config
        self.state = S.RUNNING
        self.created_at = now
        self.updated_at = now
        self.node_count = 1
        self.ranks_per_node = 0
        self.max_restarts = config.default_max_restarts
        self.policy: tuple[str, ...] = ()
        self.restarts = 0
        self.round_counter = 0
        self.round: Round | None = None
        self.queued: dict[int, str] = {}
        self.deadline: float | None = None
        self.recover_succeeded_at: float | None = None
        self.unsettled_recovers = 0
        self.recover_banned = False
        self.agents: dict[int, AgentInfo] = {}  # add with _add_agent, empty with _clear_agents (indexes below)
        # indexes derived from `agents`, kept in step by AgentInfo's setters (never persisted)
        self.online_count = 0
        self.subscribed_count = 0  # of expected nodes (0 <= node rank < node_count)
        self.finished_ok_count = 0  # of expected nodes, finished with exit code 0
        self._by_identity: dict[tuple[str, int], int | set[int]] = {}  # a node rank, or a set when shared
        self._gone_heap: list[tuple[float, int]] = []  # (gone since, node rank); stale entries dropped lazily
        self.info = ""
        self.signal_seq = 0
        self.last_signal: Signal | None = None
        self._apply_init(init or JobInit())

    # ------------------------------------------------------------------ entry point

    def handle(self, event: Event, now: float) -> Outcome:
        out = Outcome()
        needs_registered = type(event) in _NEEDS_REGISTERED_TYPES
        if needs_registered and event.node_rank not in self.agents:
            out.code = Code.NOT_REGISTERED
            out.info = f"node {event.node_rank} of job {self.job_id} is not registered (call Register first)"
            return out
        rule = self._find_rule(event)
        if rule is None:
            if isinstance(event, FIRE_AND_FORGET):
                return out
            out.code = Code.OUT_OF_ORDER
            out.info = self._out_of_order_info(event)
            return out
        if needs_registered:
            agent = self.agents[event.node_rank]
            agent.last_seen = now
            agent.online = True
        source = self.state
        target = rule.handler(self, event, now, out)
        if target not in rule.targets:
            raise AssertionError(f"{rule.handler.__name__} moved {source} to {target}, table allows {rule.targets}")
        if target != source:
            out.records.append(Record("state", self.round_number, {"from": source.value, "to": target.value}))
        self.state = target
        if target in TERMINAL:
            self.deadline = None
        if out.records or out.signals or out.agents_changed:
            self.updated_at = now
        return out

    def _find_rule(self, event: Event) -> Rule | None:
        key = (type(event), self.state)
        try:
            return _RULE_CACHE[key]
        except KeyError:
            pass
        found = next((r for r in RULES if isinstance(event, r.event) and self.state in r.sources), None)
        _RULE_CACHE[key] = found
        return found

    def _out_of_order_info(self, event: Event) -> str:
        accepting = [s.value for s in JobState
                     if any(isinstance(event, r.event) and s in r.sources and r.handler not in TOLERANT for r in RULES)]
        name = type(event).__name__
        expected = " or ".join(accepting) if accepting else "another state"
        return f"job {self.job_id} is {self.state.value}, not {expected} ({name} refused)"

    @property
    def round_number(self) -> int:
        return self.round.number if self.round else self.round_counter

    # ------------------------------------------------------------------ agent indexes

    def _expected(self, node_rank: int) -> bool:
        return 0 <= node_rank < self.node_count

    def _add_agent(self, a: AgentInfo) -> None:
        """Make `a` one of the job's agents and count its flags."""
        assert a._owner is None and a.node_rank not in self.agents, "an AgentInfo belongs to one job once"
        self.agents[a.node_rank] = a
        a._owner = self
        self._index_identity(a, add=True)
        self.online_count += a.online
        if self._expected(a.node_rank):
            self.subscribed_count += a.subscribed
            self.finished_ok_count += a.finished_ok
        if a.gone_since is not None:
            self._push_gone(a.gone_since, a.node_rank)

    def _clear_agents(self) -> None:
        for a in self.agents.values():
            a._owner = None
        self.agents.clear()
        self.online_count = self.subscribed_count = self.finished_ok_count = 0
        self._by_identity.clear()
        self._gone_heap.clear()

    def _index_identity(self, a: AgentInfo, add: bool) -> None:
        key, n = (a.host, a.pid), a.node_rank
        nodes = self._by_identity.get(key)
        if add:
            if nodes is None or nodes == n:
                self._by_identity[key] = n  # the usual case: one agent per process, no set allocated
            elif isinstance(nodes, set):
                nodes.add(n)
            else:
                self._by_identity[key] = {nodes, n}
        elif nodes == n:
            del self._by_identity[key]
        elif isinstance(nodes, set):
            nodes.discard(n)
            if len(nodes) == 1:
                self._by_identity[key] = nodes.pop()

    def _identity_nodes(self, host: str, pid: int) -> set[int]:
        nodes = self._by_identity.get((host, pid))
        return set() if nodes is None else set(nodes) if isinstance(nodes, set) else {nodes}

    def agents_at(self, host: str, pid: int) -> list[AgentInfo]:
        """The agents registered from process `pid` on `host` (usually zero or one)."""
        return [self.agents[n] for n in sorted(self._identity_nodes(host, pid))]

    def _push_gone(self, since: float, node_rank: int) -> None:
        heap = self._gone_heap
        if len(heap) > 2 * len(self.agents) + 64:  # mostly stale entries: rebuild from the agents
            heap[:] = [(a.gone_since, n) for n, a in self.agents.items() if a.gone_since is not None]
            heapq.heapify(heap)
        heapq.heappush(heap, (since, node_rank))

    def _first_gone(self) -> float | None:
        """The earliest `gone_since` of an unfinished agent (None if none is gone); amortised O(log n)."""
        heap = self._gone_heap
        while heap:
            since, n = heap[0]
            a = self.agents.get(n)
            if a is not None and a.gone_since == since and not a.finished:
                return since
            heapq.heappop(heap)
        return None

    def index_problems(self) -> list[str]:
        """Where the derived indexes disagree with a full recount of the agents (empty = consistent)."""
        expected = [a for n, a in self.agents.items() if self._expected(n)]
        counts = {
            "online_count": (self.online_count, sum(a.online for a in self.agents.values())),
            "subscribed_count": (self.subscribed_count, sum(a.subscribed for a in expected)),
            "finished_ok_count": (self.finished_ok_count, sum(a.finished_ok for a in expected)),
        }
        problems = [f"{k} is {have}, recount {want}" for k, (have, want) in counts.items() if have != want]
        identity: dict[tuple[str, int], set[int]] = {}
        for n, a in self.agents.items():
            identity.setdefault((a.host, a.pid), set()).add(n)
            if a._owner is not self:
                problems.append(f"agent {n} is not owned by this job")
        indexed = {key: self._identity_nodes(*key) for key in self._by_identity}
        if identity != indexed:
            problems.append(f"(host, pid) index {indexed} != recount {identity}")
        gone = self.gone_agents()
        first = min(gone.values()) if gone else None
        if self._first_gone() != first:
            problems.append(f"first gone agent {self._first_gone()} != recount {first}")
        return problems

    # ------------------------------------------------------------------ queries

    def expected_nodes(self) -> set[int]:
        return set(range(self.node_count))

    def gone_agents(self) -> dict[int, float]:
        """{node rank: since when} of unfinished agents without a signal stream."""
        return {n: a.gone_since for n, a in self.agents.items() if a.gone_since is not None and not a.finished}

    @property
    def loss_deadline(self) -> float | None:
        """When the first gone agent counts as lost; None while no agent is gone or loss does not apply."""
        if self.state not in ACTIVE:
            return None
        first = self._first_gone()
        return None if first is None else first + self.config.agent_loss_timeout

    @property
    def wake_at(self) -> float | None:
        """When the caller must next deliver `due_events` (the round's deadline or an agent's loss)."""
        times = [t for t in (self.deadline, self.loss_deadline) if t is not None]
        return min(times) if times else None

    def due_events(self, now: float) -> list[Event]:
        """The timer events due at `now`; an agent's loss first, so a failed job skips its round timeout."""
        due: list[Event] = []
        if self.loss_deadline is not None and self.loss_deadline <= now:
            due.append(AgentLossDue())
        if self.deadline is not None and self.deadline <= now:
            due.append(Tick())
        return due

    def owed_signal(self, node_rank: int) -> Signal | None:
        """The current phase's signal if this agent still owes an answer to it (re-sent on reconnect)."""
        r = self.round
        if r is None or self.last_signal is None or node_rank not in r.participants:
            return None
        owes = (
            (self.state == S.STOPPING and node_rank not in r.acks)
            or (self.state == S.COLLECTING and node_rank not in r.reports)
            or (self.state == S.RECOVERING and node_rank not in r.statuses)
        )
        return self.last_signal if owes else None

    def strategy_allowed(self, strategy: str) -> str:
        """Why `strategy` cannot be chosen now ("" = it can)."""
        r = self.round
        if strategy == Strategy.EXIT:
            return ""
        if r is not None:
            if strategy in r.failed:
                return "failed this round"
            if strategy in r.excluded:
                return r.excluded[strategy]
        if self.policy and strategy not in self.policy:
            return "not allowed by the job's policy"
        types = set(r.faults.values()) if r else set()
        if strategy == Strategy.RETRY and types != {FaultType.RECOVERABLE}:
            return f"fault types {sorted(types)} are not all recoverable in place"
        if strategy == Strategy.RECOVER and types - {FaultType.RECOVERABLE, FaultType.PROCESS}:
            return "network fault needs more than restarting the faulty ranks"
        if strategy == Strategy.RECOVER and self.recover_banned:
            return "recover failed to settle twice in this job"
        if strategy in RESTARTING and self.restarts >= self.max_restarts:
            return f"restart budget spent ({self.restarts}/{self.max_restarts})"
        if r is not None:
            lacking = sorted(n for n in r.participants if strategy not in r.reports.get(n, ()))
            if lacking:
                return f"not supported by node(s) {lacking}"
        return ""

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state to persist; per-agent progress of a round is not kept (the round restarts)."""
        r = self.round
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "node_count": self.node_count,
            "ranks_per_node": self.ranks_per_node,
            "max_restarts": self.max_restarts,
            "policy": list(self.policy),
            "restarts": self.restarts,
            "round_counter": self.round_counter,
            "queued": {str(k): v for k, v in self.queued.items()},
            "deadline": self.deadline,
            "recover_succeeded_at": self.recover_succeeded_at,
            "unsettled_recovers": self.unsettled_recovers,
            "recover_banned": self.recover_banned,
            "info": self.info,
            "signal_seq": self.signal_seq,
            "round": None if r is None else {
                "number": r.number,
                "started_at": r.started_at,
                "faults": {str(k): v for k, v in r.faults.items()},
                "excluded": r.excluded,
                "failed": r.failed,
                "tried": r.tried,
                "strategy": r.strategy,
            },
        }

    @classmethod
    def restore(
        cls, snap: Mapping[str, Any], agents: Iterable[AgentInfo], config: MachineConfig, now: float
    ) -> tuple[JobMachine, Outcome]:
        """Rebuild a job after a controller restart; a job caught mid-round waits in RESUMING."""
        m = cls(snap["job_id"], config, snap.get("created_at", now))
        m.state = JobState(snap["state"])
        m.updated_at = snap.get("updated_at", now)
        m.node_count = snap["node_count"]
        m.ranks_per_node = snap.get("ranks_per_node", 0)
        m.max_restarts = snap["max_restarts"]
        m.policy = tuple(snap.get("policy", ()))
        m.restarts = snap.get("restarts", 0)
        m.round_counter = snap.get("round_counter", 0)
        m.queued = {int(k): v for k, v in snap.get("queued", {}).items()}
        m.recover_succeeded_at = snap.get("recover_succeeded_at")
        m.unsettled_recovers = snap.get("unsettled_recovers", 0)
        m.recover_banned = snap.get("recover_banned", False)
        m.info = snap.get("info", "")
        m.signal_seq = snap.get("signal_seq", 0)
        for a in agents:
            a = a.copy()  # the caller's objects stay theirs (and their job's counts right)
            a.online = a.subscribed = False
            # every stream closed with the old controller: each agent gets a whole loss timeout to come back
            a.gone_since = None if a.finished or m.state in TERMINAL else now
            m._add_agent(a)
        rs = snap.get("round")
        if rs is not None:
            m.round = Round(
                number=rs["number"], started_at=rs["started_at"],
                faults={int(k): v for k, v in rs["faults"].items()},
                participants=m.expected_nodes(), excluded=dict(rs.get("excluded", {})),
                failed=list(rs.get("failed", [])), tried=list(rs.get("tried", [])), strategy=rs.get("strategy", ""),
            )
        out = Outcome()
        if m.state in ROUND_STATES and m.round is not None:
            out.records.append(Record("state", m.round.number, {"from": m.state.value, "to": S.RESUMING.value}))
            m.state = S.RESUMING
            m.deadline = now + config.resume_timeout
            out.records.append(Record("round_resuming", m.round.number, {"faults": _fmt_faults(m.round.faults)}))
        else:
            m.state = S.RUNNING if m.state in ROUND_STATES else m.state
            m.deadline = None
        return m, out

    # ------------------------------------------------------------------ helpers used by handlers

    def _apply_init(self, ev: JobInit) -> None:
        self.node_count = ev.node_count if ev.node_count > 0 else 1
        if self.agents:  # which nodes are expected changed: recount (never on the hot path, a reset empties agents)
            agents = list(self.agents.values())
            self._clear_agents()
            for a in agents:
                self._add_agent(a)
        self.ranks_per_node = ev.ranks_per_node
        self.max_restarts = ev.max_restarts if ev.max_restarts is not None else self.config.default_max_restarts
        self.policy = tuple(ev.strategies)

    def _signal(self, signal_type: str, actions: tuple[str, ...], faults: Mapping[int, str] = (),
                strategy: str = "", timeout: int = 0, reason: str = "") -> Signal:
        self.signal_seq += 1
        faults = tuple(sorted(dict(faults).items()))
        per_node = self.ranks_per_node
        sig = Signal(
            uuid=f"{self.job_id}-{self.round_number}-{self.signal_seq}",
            signal_type=signal_type, actions=actions,
            faults=faults, strategy=strategy, timeout=timeout, reason=reason,
            nodes=tuple(sorted({rank // per_node for rank, _ in faults})) if per_node > 0 else (),
        )
        self.last_signal = sig
        return sig

    def _record(self, out: Outcome, kind: str, **detail: Any) -> None:
        out.records.append(Record(kind, self.round_number, detail))

    def _open_round(self, faults: Mapping[int, str], now: float, out: Outcome) -> JobState:
        self.round_counter += 1
        r = Round(number=self.round_counter, started_at=now, faults=dict(faults), participants=self.expected_nodes())
        self.round = r
        self.info = f"round {r.number}: faults {_fmt_faults(r.faults)}"
        self._record(out, "round_started", faults=_fmt_faults(r.faults))
        if self.recover_succeeded_at is not None:
            since = now - self.recover_succeeded_at
            if since <= self.config.settle_window:
                self.unsettled_recovers += 1
                why = f"recover {since:.1f}s ago did not settle"
                r.excluded.update({Strategy.RETRY: why, Strategy.RECOVER: why})
                if self.unsettled_recovers >= 2:
                    self.recover_banned = True
                self._record(out, "recover_unsettled", seconds_since=round(since, 3),
                             count=self.unsettled_recovers, recover_banned=self.recover_banned)
            self.recover_succeeded_at = None
        return self._broadcast_stop(now, out)

    def _broadcast_stop(self, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        r.acks.clear()
        r.reports.clear()
        r.broadcast_sets.append(frozenset(r.faults))
        out.signals.append(self._signal(SignalType.STOP_TRAIN, (Action.STOP_TRAIN,), r.faults))
        self.deadline = now + self.config.stop_timeout
        return S.STOPPING

    def _to_collecting(self, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        r.reports.clear()
        if not r.participants:
            return self._decide(now, out)
        out.signals.append(self._signal(SignalType.GLOBAL_FAULT, (Action.ON_GLOBAL_RANK,), r.faults))
        self.deadline = now + self.config.strategy_timeout
        return S.COLLECTING

    def _decide(self, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        skipped: dict[str, str] = {}
        chosen = Strategy.EXIT
        if r.participants:
            for s in Strategy.ORDER:
                why = self.strategy_allowed(s)
                if not why:
                    chosen = s
                    break
                skipped[s] = why
        else:
            skipped["*"] = "no agent of the job answered"
        r.strategy = chosen
        r.strategy_started_at = now
        r.statuses.clear()
        r.tried.append(chosen)
        if chosen in RESTARTING:
            self.restarts += 1
        self._record(out, "strategy_chosen", strategy=chosen, skipped=skipped,
                     restarts=self.restarts, max_restarts=self.max_restarts)
        timeout = 0 if chosen == Strategy.EXIT else int(round(self.config.recover_timeout))
        info = ""
        if chosen == Strategy.EXIT:
            reason = "; ".join(f"{k}: {v}" for k, v in skipped.items())
            info = f"exit after round {r.number} (faults {_fmt_faults(r.faults)}): {reason}"
        out.signals.append(self._signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), r.faults,
                                        strategy=chosen, timeout=timeout, reason=info))
        if chosen == Strategy.EXIT:
            return self._fail(info, now, out, outcome="failed", notify=False)
        self.deadline = now + self.config.recover_timeout
        return S.RECOVERING

    def _close_round(self, outcome: str, now: float, out: Outcome) -> None:
        r = self.round
        if r is None:
            return
        self._record(out, "round_ended", outcome=outcome, strategy=r.strategy, tried=list(r.tried),
                     duration=round(now - r.started_at, 6), started_at=r.started_at)

    def _fail(self, info: str, now: float, out: Outcome, outcome: str = "failed", notify: bool = True) -> JobState:
        """End the job FAILED; `notify` tells every agent to stop all ranks (changeStrategy exit)."""
        if self.round is None and notify:
            self.round_counter += 1
            self.round = Round(number=self.round_counter, started_at=now, faults={}, participants=self.expected_nodes())
            self._record(out, "round_started", faults="", reason=info)
        r = self.round
        if r is not None and notify:
            r.strategy = Strategy.EXIT
            r.tried.append(Strategy.EXIT)
            self._record(out, "strategy_chosen", strategy=Strategy.EXIT, skipped={}, reason=info)
            out.signals.append(self._signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), r.faults,
                                            strategy=Strategy.EXIT, reason=info))
        self._close_round(outcome, now, out)
        self.queued.clear()
        self.deadline = None
        self.info = info
        self._record(out, "job_failed", info=info)
        return S.FAILED

    def _strategy_failed(self, why: str, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        r.failed.append(r.strategy)
        self._record(out, "strategy_failed", strategy=r.strategy, reason=why)
        if r.strategy in Strategy.TERMINAL:
            return self._fail(f"{r.strategy} failed: {why}", now, out)
        return self._decide(now, out)


# ---------------------------------------------------------------------------- handlers


def on_init(m: JobMachine, ev: JobInit, now: float, out: Outcome) -> JobState:
    callers = m.agents_at(ev.host, ev.pid) if ev.pid != 0 else []
    known = bool(callers)
    online = m.online_count > 0
    # an agent of a failed job that never finished is reconnecting (e.g. after being declared lost), not
    # starting a new run: it joins, so that its subscription learns the job failed (killMaster)
    returning = m.state == S.FAILED and any(not a.finished for a in callers)
    if (m.state in TERMINAL and not returning) or (not online and not known):
        reason = f"job was {m.state.value}" if m.state in TERMINAL else "no agent of the job is connected"
        if m.round is not None and m.state not in TERMINAL:
            m._close_round("abandoned", now, out)
        out.agents_changed.update(m.agents)
        m._clear_agents()
        m.round = None
        m.queued.clear()
        m.restarts = 0
        m.recover_succeeded_at = None
        m.unsettled_recovers = 0
        m.recover_banned = False
        m.deadline = None
        m.last_signal = None
        m._apply_init(ev)
        m.info = ""
        m._record(out, "job_reset", reason=reason, node_count=m.node_count, max_restarts=m.max_restarts,
                  policy=list(m.policy))
        out.info = f"job {m.job_id} reset ({reason})"
        return S.RUNNING
    m._record(out, "job_joined", node_rank=ev.node_rank, host=ev.host, pid=ev.pid)
    out.info = f"joined job {m.job_id} ({m.state.value})"
    return m.state


def on_register(m: JobMachine, ev: AgentRegistered, now: float, out: Outcome) -> JobState:
    if ev.node_rank >= m.node_count:
        out.code = Code.INVALID_PARAMS
        out.info = f"nodeRank {ev.node_rank} out of range: job {m.job_id} has nodeCount {m.node_count}"
        return m.state
    a = m.agents.get(ev.node_rank)
    if a is None:
        a = AgentInfo(node_rank=ev.node_rank, registered_at=now)
        m._add_agent(a)
    a.role, a.host, a.pid, a.ranks_per_node = ev.role, ev.host, ev.pid, ev.ranks_per_node
    a.online, a.last_seen = True, now
    if not a.subscribed and not a.finished and a.gone_since is None and m.state in LIVE:
        a.gone_since = now  # no signal stream yet: one that never comes is as lost as one that closed
    out.agents_changed.add(ev.node_rank)
    m._record(out, "agent_registered", node_rank=ev.node_rank, role=ev.role, host=ev.host, pid=ev.pid)
    return m.state


def on_connected(m: JobMachine, ev: AgentConnected, now: float, out: Outcome) -> JobState:
    a = m.agents[ev.node_rank]
    a.subscribed = True
    a.gone_since = None
    out.agents_changed.add(ev.node_rank)
    m._record(out, "agent_subscribed", node_rank=ev.node_rank)
    owed = m.owed_signal(ev.node_rank)
    if owed is not None:
        out.direct.append(owed)
    return m.state


def on_connected_failed(m: JobMachine, ev: AgentConnected, now: float, out: Outcome) -> JobState:
    """An agent back on a failed job (e.g. declared lost meanwhile) must stop its ranks and exit non-zero."""
    on_connected(m, ev, now, out)
    if not m.agents[ev.node_rank].finished:
        out.direct.append(m._signal(SignalType.KILL_MASTER, (), reason=m.info))
        m._record(out, "kill_master", node_rank=ev.node_rank, reason=m.info)
    return S.FAILED


def on_connected_resuming(m: JobMachine, ev: AgentConnected, now: float, out: Outcome) -> JobState:
    on_connected(m, ev, now, out)
    if m.subscribed_count >= m.node_count:  # every expected node is back
        return resume_round(m, "every agent resubscribed", now, out)
    return S.RESUMING


def resume_round(m: JobMachine, why: str, now: float, out: Outcome) -> JobState:
    r = m.round
    assert r is not None
    r.faults.update(m.queued)
    m.queued.clear()
    r.strategy = ""
    r.statuses.clear()
    r.participants = m.expected_nodes()
    m._record(out, "round_resumed", reason=why, faults=_fmt_faults(r.faults))
    return m._broadcast_stop(now, out)


def on_disconnected(m: JobMachine, ev: AgentDisconnected, now: float, out: Outcome) -> JobState:
    a = m.agents.get(ev.node_rank)
    if a is not None and a.subscribed:
        a.subscribed = a.online = False
        out.agents_changed.add(ev.node_rank)
        m._record(out, "agent_unsubscribed", node_rank=ev.node_rank)
    return m.state


def on_disconnected_live(m: JobMachine, ev: AgentDisconnected, now: float, out: Outcome) -> JobState:
    """Start the agent's loss clock: unless it resubscribes or finishes in time, the job fails."""
    a = m.agents.get(ev.node_rank)
    if a is not None and a.subscribed and not a.finished:
        a.gone_since = now
    return on_disconnected(m, ev, now, out)


def on_agent_lost(m: JobMachine, ev: AgentLossDue, now: float, out: Outcome) -> JobState:
    """Agents gone past the loss timeout took their ranks with them: nothing can restart those ranks,
    and the other ranks would wait for them forever, so the job ends (the others are told to exit)."""
    lost = {n: now - t for n, t in m.gone_agents().items() if now - t >= m.config.agent_loss_timeout}
    if not lost:
        return m.state  # came back, or finished, since the timer was set
    for n, seconds in sorted(lost.items()):
        a = m.agents[n]
        m._record(out, "agent_lost", node_rank=n, seconds=round(seconds, 3), timeout=m.config.agent_loss_timeout,
                  host=a.host, pid=a.pid)
    nodes = sorted(lost)
    if len(nodes) == 1:
        info = f"agent of node {nodes[0]} lost for {lost[nodes[0]]:.0f}s: nothing can restart its ranks"
    else:
        info = (f"agents of nodes {', '.join(map(str, nodes))} lost for {max(lost.values()):.0f}s: "
                f"nothing can restart their ranks")
    others = any(not a.finished for n, a in m.agents.items() if n not in lost)
    return m._fail(info, now, out, notify=others)


def _fault_record(m: JobMachine, out: Outcome, ev: FaultReported, faults: Mapping[int, str], action: str,
                  round_number: int | None = None) -> None:
    detail = {"node_rank": ev.node_rank, "faults": _fmt_faults(faults), "detail": ev.detail, "action": action}
    out.records.append(Record("fault_reported", m.round_number if round_number is None else round_number, detail))


def on_fault_running(m: JobMachine, ev: FaultReported, now: float, out: Outcome) -> JobState:
    faults = dict(m.queued)
    faults.update(ev.faults)
    m.queued.clear()
    _fault_record(m, out, ev, ev.faults, "opened", round_number=m.round_counter + 1)
    if m.finished_ok_count:
        # Nodes whose ranks all ended 0 have left: a restarted rank would wait for them in its first
        # collective forever. Failing now beats a stop timeout followed by a recovery that hangs.
        ranks = ", ".join(map(str, sorted(faults)))
        done = ", ".join(str(n) for n, a in sorted(m.agents.items()) if a.finished_ok)
        return m._fail(f"rank(s) {ranks} failed after node(s) {done} had finished: no recovery without them", now, out)
    return m._open_round(faults, now, out)


def on_fault_merge(m: JobMachine, ev: FaultReported, now: float, out: Outcome) -> JobState:
    r = m.round
    assert r is not None
    new = {k: v for k, v in ev.faults.items() if r.faults.get(k) != v}
    if not new:
        out.info = f"already in round {r.number}"
        return m.state
    r.faults.update(new)
    _fault_record(m, out, ev, new, "merged")
    m._record(out, "round_faults", faults=_fmt_faults(r.faults))
    if m.state == S.RESUMING:
        return S.RESUMING
    return m._broadcast_stop(now, out)


def on_fault_queue(m: JobMachine, ev: FaultReported, now: float, out: Outcome) -> JobState:
    new = {k: v for k, v in ev.faults.items() if m.queued.get(k) != v}
    if not new:
        out.info = "already queued"
        return m.state
    m.queued.update(new)
    _fault_record(m, out, ev, new, "queued")
    out.info = f"queued for the round after round {m.round_number}"
    return m.state


def on_fault_terminal(m: JobMachine, ev: FaultReported, now: float, out: Outcome) -> JobState:
    out.code = Code.OUT_OF_ORDER
    out.info = f"job {m.job_id} is {m.state.value}, not RUNNING: no recovery for a finished job"
    return m.state


def on_stop_complete(m: JobMachine, ev: StopComplete, now: float, out: Outcome) -> JobState:
    r = m.round
    assert r is not None
    reported = frozenset(ev.faults)
    if reported and reported != r.broadcast_sets[-1] and reported in r.broadcast_sets[:-1]:
        m._record(out, "stop_complete_stale", node_rank=ev.node_rank, faults=_fmt_faults(ev.faults))
        out.info = "acknowledges an earlier stopTrain; waiting for the one with the merged fault set"
        return S.STOPPING
    m._record(out, "stop_complete", node_rank=ev.node_rank, code=ev.code, info=ev.info)
    if ev.code != Code.OK:
        why = f"node {ev.node_rank} could not stop its ranks ({ev.code}: {ev.info})"
        for s in IN_PLACE:
            r.excluded.setdefault(s, why)
    r.acks.add(ev.node_rank)
    if r.participants <= r.acks:
        return m._to_collecting(now, out)
    return S.STOPPING


def on_repeated_stop_complete(m: JobMachine, ev: StopComplete, now: float, out: Outcome) -> JobState:
    """A duplicate of an answer already counted (a client retry) is fine; anything else is out of order."""
    if m.round is not None and ev.node_rank in m.round.acks and ev.code == Code.OK:
        out.info = f"already counted; job {m.job_id} is {m.state.value}"
        return m.state
    out.code = Code.OUT_OF_ORDER
    out.info = m._out_of_order_info(ev)
    return m.state


def on_repeated_strategies(m: JobMachine, ev: StrategiesReported, now: float, out: Outcome) -> JobState:
    if m.round is not None and m.round.reports.get(ev.node_rank) == tuple(ev.strategies):
        out.info = f"already counted; job {m.job_id} is {m.state.value}"
        return m.state
    out.code = Code.OUT_OF_ORDER
    out.info = m._out_of_order_info(ev)
    return m.state


def on_strategies(m: JobMachine, ev: StrategiesReported, now: float, out: Outcome) -> JobState:
    r = m.round
    assert r is not None
    r.reports[ev.node_rank] = tuple(ev.strategies)
    m._record(out, "strategies_reported", node_rank=ev.node_rank, strategies=list(ev.strategies))
    if r.participants <= r.reports.keys():  # no set built per report: 10,000 reports made that O(N^2)
        return m._decide(now, out)
    return S.COLLECTING


def on_recover_status(m: JobMachine, ev: RecoverStatusReported, now: float, out: Outcome) -> JobState:
    r = m.round
    assert r is not None
    if ev.strategy and ev.strategy != r.strategy:
        out.code = Code.OUT_OF_ORDER
        out.info = f"job {m.job_id} is carrying out {r.strategy}, not {ev.strategy}"
        return m.state
    m._record(out, "recover_status", node_rank=ev.node_rank, code=ev.code, info=ev.info, strategy=r.strategy,
              isolate=list(ev.isolate_ranks))
    if ev.code != Code.OK:
        return m._strategy_failed(f"node {ev.node_rank} reported {ev.code}: {ev.info}", now, out)
    r.statuses.add(ev.node_rank)
    if not r.participants <= r.statuses:
        return S.RECOVERING
    if r.strategy == Strategy.DUMP:
        m._close_round("dumped", now, out)
        m.info = f"dumped after round {r.number} (faults {_fmt_faults(r.faults)})"
        m._record(out, "job_failed", info=m.info)
        m.deadline = None
        m.queued.clear()
        return S.FAILED
    m._close_round("recovered", now, out)
    m._record(out, "recovered", strategy=r.strategy, duration=round(now - r.started_at, 6))
    if r.strategy == Strategy.RECOVER:
        m.recover_succeeded_at = now
    m.info = f"recovered round {r.number} with {r.strategy} in {now - r.started_at:.2f}s"
    m.round = None
    m.deadline = None
    if m.queued:
        faults, m.queued = m.queued, {}
        return m._open_round(faults, now, out)
    return S.RUNNING


def on_late_status(m: JobMachine, ev: RecoverStatusReported, now: float, out: Outcome) -> JobState:
    """An agent confirming the exit/dump that ended the job."""
    r = m.round
    if r is None or (ev.strategy and ev.strategy != r.strategy):
        out.code = Code.OUT_OF_ORDER
        current = r.strategy if r else "nothing"
        out.info = f"job {m.job_id} is {m.state.value} after {current}, not carrying out {ev.strategy or 'a strategy'}"
        return m.state
    m._record(out, "recover_status", node_rank=ev.node_rank, code=ev.code, info=ev.info, strategy=r.strategy,
              isolate=list(ev.isolate_ranks))
    return m.state


def on_finished(m: JobMachine, ev: AgentFinished, now: float, out: Outcome) -> JobState:
    a = m.agents[ev.node_rank]
    a.finished, a.exit_code = True, ev.exit_code
    out.agents_changed.add(ev.node_rank)
    m._record(out, "agent_finished", node_rank=ev.node_rank, exit_code=ev.exit_code, message=ev.message)
    if m.state in TERMINAL:
        return m.state
    if ev.exit_code != 0:
        return m._fail(f"node {ev.node_rank} finished with exit code {ev.exit_code}: {ev.message}".rstrip(": "),
                       now, out)
    if m.finished_ok_count >= m.node_count:  # every expected node finished with exit code 0
        if m.round is not None:
            m._close_round("finished", now, out)
            m.round = None
        m.deadline = None
        m.queued.clear()
        m.info = "every agent finished with exit code 0"
        m._record(out, "job_succeeded", info=m.info)
        return S.SUCCEEDED
    return m.state


def _missing(m: JobMachine, answered: Iterable[int]) -> list[int]:
    assert m.round is not None
    return sorted(m.round.participants - set(answered))


def _due(m: JobMachine, now: float) -> bool:
    return m.deadline is not None and now >= m.deadline


def _drop_silent(m: JobMachine, answered: Iterable[int], kind: str, why: str, out: Outcome) -> None:
    """A stop or strategy timeout: the round goes on without the agents that did not answer, and
    excludes the in-place strategies, since it no longer knows the state of those nodes."""
    r = m.round
    assert r is not None
    missing = _missing(m, answered)
    m._record(out, kind, missing=missing)
    r.participants -= set(missing)
    for s in IN_PLACE:
        r.excluded.setdefault(s, why.format(missing=missing))


def on_tick_stopping(m: JobMachine, ev: Tick, now: float, out: Outcome) -> JobState:
    if not _due(m, now):
        return m.state
    assert m.round is not None
    _drop_silent(m, m.round.acks, "stop_timeout", "stop timeout: node(s) {missing} did not confirm", out)
    return m._to_collecting(now, out)


def on_tick_collecting(m: JobMachine, ev: Tick, now: float, out: Outcome) -> JobState:
    if not _due(m, now):
        return m.state
    assert m.round is not None
    _drop_silent(m, m.round.reports, "collect_timeout", "strategy timeout: node(s) {missing} did not report", out)
    return m._decide(now, out)


def on_tick_recovering(m: JobMachine, ev: Tick, now: float, out: Outcome) -> JobState:
    if not _due(m, now):
        return m.state
    r = m.round
    assert r is not None
    missing = _missing(m, r.statuses)
    m._record(out, "recover_timeout", strategy=r.strategy, missing=missing)
    return m._strategy_failed(f"timed out waiting for node(s) {missing}", now, out)


def on_tick_resuming(m: JobMachine, ev: Tick, now: float, out: Outcome) -> JobState:
    if not _due(m, now):
        return m.state
    back = sorted(n for n, a in m.agents.items() if a.subscribed)
    return resume_round(m, f"resume timeout; agents back: {back}", now, out)


# ---------------------------------------------------------------------------- the table

_SAME = ANY  # handlers that keep the state may be called in any state

RULES: tuple[Rule, ...] = (
    # job and agent lifecycle
    Rule(ANY, JobInit, frozenset({S.RUNNING}) | _SAME, on_init),
    Rule(ANY, AgentRegistered, _SAME, on_register),
    Rule(frozenset({S.RESUMING}), AgentConnected, frozenset({S.RESUMING, S.STOPPING}), on_connected_resuming),
    Rule(frozenset({S.FAILED}), AgentConnected, frozenset({S.FAILED}), on_connected_failed),
    Rule(ANY, AgentConnected, _SAME, on_connected),
    Rule(LIVE, AgentDisconnected, _SAME, on_disconnected_live),
    Rule(ANY, AgentDisconnected, _SAME, on_disconnected),
    Rule(ANY, AgentFinished, frozenset({S.SUCCEEDED, S.FAILED}) | _SAME, on_finished),
    # an agent gone past the loss timeout (its stream closed, no finish, no resubscription) fails the job
    Rule(ACTIVE, AgentLossDue, frozenset({S.FAILED}) | _SAME, on_agent_lost),
    # a fault opens a round, joins an undecided one, or waits for the next
    Rule(frozenset({S.RUNNING}), FaultReported, frozenset({S.STOPPING, S.FAILED}), on_fault_running),
    Rule(frozenset({S.STOPPING, S.COLLECTING, S.RESUMING}), FaultReported,
         frozenset({S.STOPPING, S.COLLECTING, S.RESUMING}), on_fault_merge),
    Rule(frozenset({S.RECOVERING}), FaultReported, frozenset({S.RECOVERING}), on_fault_queue),
    Rule(TERMINAL, FaultReported, TERMINAL, on_fault_terminal),
    # the round: stop -> collect -> decide -> recover
    Rule(frozenset({S.STOPPING}), StopComplete,
         frozenset({S.STOPPING, S.COLLECTING, S.RECOVERING, S.FAILED}), on_stop_complete),
    Rule(frozenset({S.COLLECTING, S.RECOVERING}), StopComplete, _SAME, on_repeated_stop_complete),
    Rule(frozenset({S.COLLECTING}), StrategiesReported,
         frozenset({S.COLLECTING, S.RECOVERING, S.FAILED}), on_strategies),
    Rule(frozenset({S.RECOVERING}), StrategiesReported, _SAME, on_repeated_strategies),
    Rule(frozenset({S.RECOVERING}), RecoverStatusReported,
         frozenset({S.RECOVERING, S.RUNNING, S.STOPPING, S.FAILED}), on_recover_status),
    Rule(frozenset({S.FAILED}), RecoverStatusReported, frozenset({S.FAILED}), on_late_status),
    # deadlines
    Rule(frozenset({S.STOPPING}), Tick, frozenset({S.STOPPING, S.COLLECTING, S.RECOVERING, S.FAILED}),
         on_tick_stopping),
    Rule(frozenset({S.COLLECTING}), Tick, frozenset({S.COLLECTING, S.RECOVERING, S.FAILED}), on_tick_collecting),
    Rule(frozenset({S.RECOVERING}), Tick, frozenset({S.RECOVERING, S.FAILED}), on_tick_recovering),
    Rule(frozenset({S.RESUMING}), Tick, frozenset({S.RESUMING, S.STOPPING}), on_tick_resuming),
)


_NEEDS_REGISTERED_TYPES = frozenset(NEEDS_REGISTERED)  # the events are final classes: a set lookup is enough
_RULE_CACHE: dict[tuple[type, JobState], Rule | None] = {}  # first matching rule per (event type, state)

TOLERANT = (on_repeated_stop_complete, on_repeated_strategies, on_late_status)
"""Rules that only accept duplicates; not named as "the state that accepts this" in a 401."""


def describe_table() -> str:
    """The transition table as text (used by the docs and handy in a debugger)."""
    named = {ANY: "*", LIVE: "LIVE (not terminal)", ACTIVE: "ACTIVE (LIVE, not RESUMING)"}
    rows = []
    for r in RULES:
        src = named.get(r.sources) or ",".join(sorted(s.value for s in r.sources))
        dst = "same" if r.targets == ANY else ",".join(sorted(s.value for s in r.targets))
        rows.append(f"{src:<30} {r.event.__name__:<22} -> {dst:<40} {r.handler.__name__}")
    return "\n".join(rows)


__all__ = [
    "JobState", "MachineConfig", "JobMachine", "Outcome", "Signal", "Record", "AgentInfo", "Round", "Rule", "RULES",
    "JobInit", "AgentRegistered", "AgentConnected", "AgentDisconnected", "FaultReported", "StopComplete",
    "StrategiesReported", "RecoverStatusReported", "AgentFinished", "Tick", "AgentLossDue", "describe_table",
]
