"""The ranks of one node: their typed states, the layout discovered from MONITOR, and the table of them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import psutil

from taskd.agent.config import AgentConfig
from taskd.vocabulary import FaultRanks
from taskd.worker.env import env_int


class RankState(str, Enum):
    """Where one rank's current incarnation stands, as the agent sees it."""

    NOT_STARTED = "not-started"
    RUNNING = "running"
    STOPPING = "stopping"  # the agent is stopping it: its exit is not a fault
    STOPPED = "stopped"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def alive(self) -> bool:
        return self in (RankState.RUNNING, RankState.STOPPING)


@dataclass
class Rank:
    local_rank: int
    global_rank: int
    pid: int | None = None
    pgid: int | None = None
    proc: psutil.Process | None = None  # pinned by (pid, start time): tells a reused pid from ours
    state: RankState = RankState.NOT_STARTED
    returncode: int | None = None


@dataclass(frozen=True)
class RankLayout:
    """Where this node stands in the job: what the configuration said, completed from MONITOR."""

    node_rank: int
    node_count: int
    global_ranks: tuple[int, ...]  # indexed by local rank

    @property
    def ranks_per_node(self) -> int:
        return len(self.global_ranks)


def discover_layout(config: AgentConfig, entries: Mapping[int, Mapping[str, Any]],
                    environ: Mapping[str, str] | None = None, node_rank: int | None = None) -> RankLayout:
    """The layout from MONITOR([-1])'s answer before any rank runs (msrun answers status 200 with global ranks).

    Settings the configuration fixes win (`node_rank`: a standby's assigned node, over the configuration's); the
    rest come from MONITOR, then from msrun's or torchrun's world size in the environment, then single-node defaults.
    """
    count = config.ranks_per_node or len(entries)
    if count <= 0:
        raise RuntimeError("MONITOR([-1]) returned no ranks and ranks_per_node is not set: "
                           "set TASKD_NPROC_PER_NODE to the number of ranks this node runs")
    node_rank = node_rank if node_rank is not None else config.node_rank
    if node_rank is None:
        node_ids = [e.get("node_id") for e in entries.values() if isinstance(e.get("node_id"), int)]
        if node_ids and node_ids[0] >= 0:
            node_rank = node_ids[0]
        elif 0 in entries and isinstance(entries[0].get("global_rank"), int):
            node_rank = max(0, entries[0]["global_rank"]) // count
        else:
            node_rank = 0
    node_count = config.node_count
    if node_count is None:
        total = 0
        for var in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
            try:
                total = env_int(var, 0, environ) or 0
            except ValueError:
                total = 0
            if total:
                break
        node_count = max(1, -(-total // count)) if total else 1
    global_ranks = []
    for local_rank in range(count):
        global_rank = entries.get(local_rank, {}).get("global_rank")
        if not isinstance(global_rank, int) or global_rank < 0:
            global_rank = node_rank * count + local_rank
        global_ranks.append(global_rank)
    return RankLayout(node_rank, node_count, tuple(global_ranks))


class RankTable:
    """Every rank of the node by local rank, and the global -> local mapping fault ranks need.

    Empty until the layout is known (`lay_out`), so that an agent that fails before it knows its
    ranks still has a table to clean up from.
    """

    def __init__(self, layout: RankLayout | None = None) -> None:
        self.layout: RankLayout | None = None
        self.ranks: dict[int, Rank] = {}
        self._local_of: dict[int, int] = {}
        if layout is not None:
            self.lay_out(layout)

    def lay_out(self, layout: RankLayout) -> None:
        self.layout = layout
        self.ranks = {local: Rank(local, global_) for local, global_ in enumerate(layout.global_ranks)}
        self._local_of = {r.global_rank: r.local_rank for r in self.ranks.values()}

    def clear(self) -> None:
        """No node any more (a standby whose node migration was called off): no layout, no rank."""
        self.layout, self.ranks, self._local_of = None, {}, {}

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, local_rank: int) -> Rank:
        return self.ranks[local_rank]

    def get(self, local_rank: int) -> Rank | None:
        return self.ranks.get(local_rank)

    def all(self) -> list[Rank]:
        return list(self.ranks.values())

    def local_ranks(self) -> list[int]:
        return sorted(self.ranks)

    def in_state(self, *states: RankState) -> list[Rank]:
        return [r for r in self.ranks.values() if r.state in states]

    def alive(self) -> list[Rank]:
        return [r for r in self.ranks.values() if r.state.alive]

    def all_succeeded(self) -> bool:
        return bool(self.ranks) and all(r.state is RankState.SUCCEEDED for r in self.ranks.values())

    def local_of(self, faults: FaultRanks | Iterable[int]) -> list[int]:
        """The local ranks of the global ranks given that live on this node."""
        return sorted(self._local_of[g] for g in faults if g in self._local_of)

    def pids(self, global_ranks: Iterable[int] | None = None) -> str:
        """`rank:pid, ...` for the console (every rank when none are given)."""
        if global_ranks is None:
            return ", ".join(f"{r.global_rank}:{r.pid}" for r in self.ranks.values())
        chosen = [self.ranks[self._local_of[g]] for g in global_ranks if g in self._local_of]
        return ", ".join(f"{r.global_rank}:{r.pid}" for r in chosen)


def own_group(pgid: int | None, pid: int) -> int:
    """A rank's process group: its own pid when it is gone or still shares ours (it died before its setsid)."""
    return pid if pgid in (None, os.getpgrp()) else pgid
