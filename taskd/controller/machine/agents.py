"""The agents of one job, and the indexes that keep every per-agent event O(1).

`AgentInfo` is one agent's record. Its counted fields (identity, online, subscribed, finished, gone)
are read-only: they change only through the explicit methods of the job's `AgentTable`
(`set_online`, `set_subscribed`, `finish`, `set_gone`, `set_identity`, and `put_back` to undo an
event), which keep the counts, the (host, pid) index and the loss heap in step. So no event walks the
job's agents, however many it has.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping


class AgentInfo:
    """One agent of a job. Counted fields are read-only here; `AgentTable` changes them."""

    __slots__ = ("node_rank", "role", "ranks_per_node", "registered_at", "last_seen", "_host", "_pid", "_online",
                 "_subscribed", "_finished", "_exit_code", "_gone_since", "_loss_after", "_table")

    def __init__(self, node_rank: int, role: str = "", host: str = "", pid: int = 0, ranks_per_node: int = 0,
                 registered_at: float = 0.0, last_seen: float = 0.0, online: bool = False, subscribed: bool = False,
                 finished: bool = False, exit_code: int = 0, gone_since: float | None = None,
                 loss_after: float = math.inf) -> None:
        self._table: AgentTable | None = None
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
        # without a signal stream since (registered, stream closed, controller restart), and lost this long after
        self._gone_since = gone_since
        self._loss_after = loss_after

    def copy(self) -> AgentInfo:
        """The same record, owned by no table."""
        return AgentInfo(self.node_rank, self.role, self._host, self._pid, self.ranks_per_node, self.registered_at,
                         self.last_seen, self._online, self._subscribed, self._finished, self._exit_code,
                         self._gone_since, self._loss_after)

    def __repr__(self) -> str:
        return (f"AgentInfo(node_rank={self.node_rank}, host={self._host!r}, pid={self._pid}, online={self._online}, "
                f"subscribed={self._subscribed}, finished={self._finished}, exit_code={self._exit_code}, "
                f"gone_since={self._gone_since})")

    @property
    def host(self) -> str:
        return self._host

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def online(self) -> bool:
        return self._online

    @property
    def subscribed(self) -> bool:
        return self._subscribed

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def exit_code(self) -> int:
        return self._exit_code

    @property
    def finished_ok(self) -> bool:
        return self._finished and self._exit_code == 0

    @property
    def gone_since(self) -> float | None:
        return self._gone_since

    @property
    def loss_after(self) -> float:
        return self._loss_after

    @property
    def loss_at(self) -> float | None:
        """When this agent counts as lost unless it subscribes or finishes first (None: its clock is not running)."""
        return None if self._gone_since is None or self._finished else self._gone_since + self._loss_after


class AgentTable(Mapping[int, AgentInfo]):
    """The agents of one job by node rank (read as a mapping), with counts derived from their flags.

    Counts cover the expected nodes only (0 <= node rank < `node_count`), except `online_count`.
    The derived state is never persisted: `add` rebuilds it from the records."""

    def __init__(self, node_count: int = 1) -> None:
        self._agents: dict[int, AgentInfo] = {}
        self._node_count = node_count
        self.online_count = 0
        self.subscribed_count = 0  # of expected nodes
        self.finished_ok_count = 0  # of expected nodes, finished with exit code 0
        self._by_identity: dict[tuple[str, int], int | set[int]] = {}  # a node rank, or a set when shared
        self._gone_heap: list[tuple[float, int]] = []  # (gone since, node rank); stale entries dropped lazily

    # ------------------------------------------------------------------ mapping (read-only)

    def __getitem__(self, node_rank: int) -> AgentInfo:
        return self._agents[node_rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def __contains__(self, node_rank: object) -> bool:  # per event: skip Mapping's try/except
        return node_rank in self._agents

    def get(self, node_rank: int, default: AgentInfo | None = None) -> AgentInfo | None:  # type: ignore[override]
        return self._agents.get(node_rank, default)

    def __repr__(self) -> str:
        return f"AgentTable({self._agents!r})"

    # ------------------------------------------------------------------ membership

    @property
    def node_count(self) -> int:
        return self._node_count

    def expected(self, node_rank: int) -> bool:
        return 0 <= node_rank < self._node_count

    def set_node_count(self, node_count: int) -> None:
        """Which nodes are expected changed: recount (never on the hot path; a reset empties the table)."""
        if node_count == self._node_count:
            return
        self._node_count = node_count
        agents = list(self._agents.values())
        self.clear()
        for a in agents:
            self.add(a)

    def add(self, a: AgentInfo) -> None:
        """Make `a` one of the job's agents and count its flags."""
        assert a._table is None and a.node_rank not in self._agents, "an AgentInfo belongs to one job once"
        self._agents[a.node_rank] = a
        a._table = self
        self._index_identity(a, add=True)
        self.online_count += a.online
        if self.expected(a.node_rank):
            self.subscribed_count += a.subscribed
            self.finished_ok_count += a.finished_ok
        if a.loss_at is not None:
            self._push_gone(a.loss_at, a.node_rank)

    def put_back(self, node_rank: int, saved: AgentInfo | None) -> None:
        """Make node `node_rank`'s record what `saved` holds (None: no agent), counts and indexes included:
        how an event whose change could not be stored is undone. The record object itself is kept."""
        current = self._agents.get(node_rank)
        if current is not None:  # uncounted, unindexed; its entries in the loss heap go stale, dropped lazily
            self._index_identity(current, add=False)
            self.online_count -= current.online
            if self.expected(node_rank):
                self.subscribed_count -= current.subscribed
                self.finished_ok_count -= current.finished_ok
            del self._agents[node_rank]
            current._table = None
        if saved is None:
            return
        target = current if current is not None else AgentInfo(node_rank)
        for name in AgentInfo.__slots__:
            if name != "_table":
                setattr(target, name, getattr(saved, name))
        self.add(target)

    def clear(self) -> None:
        for a in self._agents.values():
            a._table = None
        self._agents.clear()
        self.online_count = self.subscribed_count = self.finished_ok_count = 0
        self._by_identity.clear()
        self._gone_heap.clear()

    # ------------------------------------------------------------------ the explicit changes

    def set_identity(self, a: AgentInfo, host: str, pid: int) -> None:
        """The process the agent runs as (a re-registration may come from a new process)."""
        if (host, pid) == (a._host, a._pid):
            return
        self._index_identity(a, add=False)
        a._host, a._pid = host, pid
        self._index_identity(a, add=True)

    def set_online(self, a: AgentInfo, online: bool) -> None:
        if online != a._online:
            a._online = online
            self.online_count += 1 if online else -1

    def set_subscribed(self, a: AgentInfo, subscribed: bool) -> None:
        if subscribed != a._subscribed:
            a._subscribed = subscribed
            if self.expected(a.node_rank):
                self.subscribed_count += 1 if subscribed else -1

    def finish(self, a: AgentInfo, exit_code: int) -> None:
        """The agent reported its finish (a repeat may change the exit code)."""
        before = a.finished_ok
        a._finished, a._exit_code = True, exit_code
        after = a.finished_ok
        if before != after and self.expected(a.node_rank):
            self.finished_ok_count += 1 if after else -1

    def set_gone(self, a: AgentInfo, since: float | None, within: float = math.inf) -> None:
        """Start (`since`, lost `within` seconds later) or stop (None) the agent's loss clock."""
        a._gone_since = since
        a._loss_after = within
        if a.loss_at is not None:
            self._push_gone(a.loss_at, a.node_rank)

    # ------------------------------------------------------------------ queries

    def at(self, host: str, pid: int) -> list[AgentInfo]:
        """The agents registered from process `pid` on `host` (usually zero or one)."""
        return [self._agents[n] for n in sorted(self._identity_nodes(host, pid))]

    def gone(self) -> dict[int, float]:
        """{node rank: since when} of unfinished agents without a signal stream."""
        return {n: a.gone_since for n, a in self._agents.items() if a.gone_since is not None and not a.finished}

    def first_loss(self) -> tuple[float, int] | None:
        """(loss deadline, node rank) of the agent lost first unless it comes back (None: no clock runs);
        amortised O(log n)."""
        heap = self._gone_heap
        while heap:
            at, n = heap[0]
            a = self._agents.get(n)
            if a is not None and a.loss_at == at:
                return at, n
            heapq.heappop(heap)
        return None

    def first_loss_at(self) -> float | None:
        first = self.first_loss()
        return None if first is None else first[0]

    def clocked(self) -> set[int]:
        """The node ranks whose loss clock runs (from the loss heap: O(gone agents), not O(agents))."""
        return {n for at, n in self._gone_heap if (a := self._agents.get(n)) is not None and a.loss_at == at}

    def lost_by(self, now: float) -> dict[int, AgentInfo]:
        """The agents whose loss deadline has passed at `now` (O(lost · log n))."""
        due: dict[int, AgentInfo] = {}
        heap = self._gone_heap
        while heap and heap[0][0] <= now:
            at, n = heapq.heappop(heap)
            a = self._agents.get(n)
            if a is not None and a.loss_at == at:
                due[n] = a
        for n, a in due.items():  # still theirs until the caller stops their clocks
            heapq.heappush(heap, (a.loss_at, n))  # type: ignore[arg-type]
        return due

    def problems(self) -> list[str]:
        """Where the derived indexes disagree with a full recount of the agents (empty = consistent)."""
        agents = self._agents
        expected = [a for n, a in agents.items() if self.expected(n)]
        counts = {
            "online_count": (self.online_count, sum(a.online for a in agents.values())),
            "subscribed_count": (self.subscribed_count, sum(a.subscribed for a in expected)),
            "finished_ok_count": (self.finished_ok_count, sum(a.finished_ok for a in expected)),
        }
        problems = [f"{k} is {have}, recount {want}" for k, (have, want) in counts.items() if have != want]
        identity: dict[tuple[str, int], set[int]] = {}
        for n, a in agents.items():
            identity.setdefault((a.host, a.pid), set()).add(n)
            if a._table is not self:
                problems.append(f"agent {n} is not owned by this job")
        indexed = {key: self._identity_nodes(*key) for key in self._by_identity}
        if identity != indexed:
            problems.append(f"(host, pid) index {indexed} != recount {identity}")
        deadlines = [a.loss_at for a in agents.values() if a.loss_at is not None]
        first = min(deadlines) if deadlines else None
        if self.first_loss_at() != first:
            problems.append(f"first loss deadline {self.first_loss_at()} != recount {first}")
        return problems

    # ------------------------------------------------------------------ index upkeep

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

    def _push_gone(self, at: float, node_rank: int) -> None:
        heap = self._gone_heap
        if len(heap) > 2 * len(self._agents) + 64:  # mostly stale entries: rebuild from the agents
            heap[:] = [(a.loss_at, n) for n, a in self._agents.items() if a.loss_at is not None]
            heapq.heapify(heap)
        heapq.heappush(heap, (at, node_rank))
