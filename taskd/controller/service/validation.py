"""Request checks: each returns "" or an info naming the offending field (answered 409).

Everything here runs before the request reaches the core, so a refused request changes nothing.
The job-aware checks (`rank_refusal`) read the job and answer 402 for ranks it does not have.
"""

from __future__ import annotations

import functools
import math
import unicodedata
from collections.abc import Iterable, Sequence

from taskd.controller.config import RANK_LIMIT
from taskd.pace import check_factor
from taskd.proto import recover_pb2, taskd_pb2
from taskd.settings import setting
from taskd.vocabulary import FaultType, Strategy

MAX_LIST = 100_000
MAX_STRING = 4096
MAX_JOB_ID_BYTES = 256
MAX_RANKS_PER_NODE = 65536
MAX_RESTART_BUDGET = setting("max_restarts").bound.high  # the agent refuses more when it is built
"""The largest `maxRestarts` a job may ask for: a restart costs seconds at least, so 10,000 outlasts any
real run, while 2^31-1 is an unbounded budget dressed as a number."""
MAX_STRATEGY_NAMES = 16
RESTORE_SOURCES = ("memory", "buddy", "persisted", "disk", "none")  # as taskd.worker.snapshot_account.SOURCES
"""Entries in a strategy list: there are five strategies; a few repeats are tolerated (and dropped)."""
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Control, format (bidi overrides, zero-width), surrogate, private-use, unassigned, line/paragraph separators."""


def _str(name: str, value: str) -> str:
    if len(value) > MAX_STRING:
        return f"{name} is {len(value)} characters long (max {MAX_STRING})"
    return ""


def _strings(pairs: Iterable[tuple[str, str]]) -> str:
    for name, value in pairs:
        if why := _str(name, value):
            return why
    return ""


def check_job_id(job_id: str) -> str:
    """Non-empty, at most 256 bytes of UTF-8, printable: it is shown in logs, consoles and `taskd status`.
    The printable check is cached (every report names its job; it was ~10 us a call), for ids of a valid
    length only: a peer sending ever new megabyte-long ids must not fill the cache with them."""
    if not job_id:
        return "jobId is empty"
    if len(job_id) > MAX_JOB_ID_BYTES:  # more characters than bytes allowed: too long whatever its encoding
        return f"jobId is {len(job_id.encode('utf-8', 'surrogatepass'))} bytes long (max {MAX_JOB_ID_BYTES})"
    return _check_short_job_id(job_id)


@functools.lru_cache(maxsize=16384)
def _check_short_job_id(job_id: str) -> str:
    size = len(job_id.encode("utf-8", "surrogatepass"))
    if size > MAX_JOB_ID_BYTES:
        return f"jobId is {size} bytes long (max {MAX_JOB_ID_BYTES})"
    for i, c in enumerate(job_id):
        if unicodedata.category(c) in _UNPRINTABLE:
            return f"jobId has an unprintable character U+{ord(c):04X} at position {i}"
    return ""


def _non_negative(pairs: Iterable[tuple[str, int]]) -> str:
    for name, value in pairs:
        if value < 0:
            return f"{name} must be >= 0, got {value}"
    return ""


def _rank_id(name: str, text: str) -> str:
    if not text.isascii() or not text.isdigit():
        return f"{name} {text[:64]!r} is not a non-negative integer"
    if len(text) > 10 or int(text) > RANK_LIMIT:  # length first: int() of 5,000 digits raises
        return f"{name} {text[:64]!r} does not fit a 32-bit rank id (max {RANK_LIMIT})"
    return ""


def _list(name: str, items: Sequence[object]) -> str:
    if len(items) > MAX_LIST:
        return f"{name} has {len(items)} entries (max {MAX_LIST})"
    return ""


def check_faults(faults: Sequence[recover_pb2.FaultRank], name: str = "faultRanks", required: bool = False) -> str:
    if why := _list(name, faults):
        return why
    if required and not faults:
        return f"{name} is empty"
    for i, f in enumerate(faults):
        if why := _rank_id(f"{name}[{i}].rankId", f.rankId):
            return why
        if f.faultType not in FaultType.ALL:
            return f"{name}[{i}].faultType {f.faultType[:64]!r} is not one of {', '.join(FaultType.ALL)}"
    return ""


def check_strategies(names: Sequence[str], field: str = "strategies") -> str:
    if len(names) > MAX_STRATEGY_NAMES:
        return (f"{field} has {len(names)} entries (max {MAX_STRATEGY_NAMES}; there are {len(Strategy.KNOWN)} "
                f"strategies: {', '.join(Strategy.KNOWN)})")
    for i, s in enumerate(names):
        if s not in Strategy.KNOWN:
            return f"{field}[{i}] {s[:64]!r} is not a known strategy ({', '.join(Strategy.KNOWN)})"
    return ""


def unique(names: Iterable[str]) -> tuple[str, ...]:
    """A validated strategy list without its repeats, first occurrence kept (the order is the preference)."""
    return tuple(dict.fromkeys(names))


def check_client(info: recover_pb2.ClientInfo, max_node_count: int = 65536, max_ranks: int = RANK_LIMIT) -> str:
    return (
        check_job_id(info.jobId)
        or _strings([("role", info.role), ("host", info.host)])
        or _non_negative([("nodeRank", info.nodeRank), ("nodeCount", info.nodeCount),
                          ("ranksPerNode", info.ranksPerNode), ("pid", info.pid), ("restartsUsed", info.restartsUsed)]
                         + ([("maxRestarts", info.maxRestarts)] if info.HasField("maxRestarts") else []))
        or _sizes(info, max_node_count, max_ranks)
        or check_strategies(info.strategies)
        or _min_nodes(info)
    )


def _min_nodes(info: recover_pb2.ClientInfo) -> str:
    if info.minNodes < 0 or (info.minNodes and info.minNodes > max(info.nodeCount, 1)):
        return (f"minNodes {info.minNodes} must be 0 (a fixed-size job) or in [1, nodeCount {max(info.nodeCount, 1)}] "
                "(`taskd run --nnodes MIN:MAX`)")
    return ""


def _sizes(info: recover_pb2.ClientInfo, max_node_count: int, max_ranks: int = RANK_LIMIT) -> str:
    if info.HasField("maxRestarts") and info.maxRestarts > MAX_RESTART_BUDGET:
        return f"maxRestarts {info.maxRestarts} is above {MAX_RESTART_BUDGET}"
    if info.restartsUsed > MAX_RESTART_BUDGET:
        return f"restartsUsed {info.restartsUsed} is above {MAX_RESTART_BUDGET}"
    if info.nodeCount > max_node_count:
        return f"nodeCount {info.nodeCount} is above this controller's limit of {max_node_count} (--max-node-count)"
    if info.nodeRank >= max_node_count:
        return f"nodeRank {info.nodeRank} is above this controller's limit of {max_node_count} nodes (--max-node-count)"
    if info.ranksPerNode > MAX_RANKS_PER_NODE:
        return f"ranksPerNode {info.ranksPerNode} is above {MAX_RANKS_PER_NODE}"
    if max(info.nodeCount, 1) * info.ranksPerNode > RANK_LIMIT:
        return f"nodeCount * ranksPerNode = {info.nodeCount * info.ranksPerNode} ranks does not fit 32-bit rank ids"
    if max(info.nodeCount, 1) * info.ranksPerNode > max_ranks:
        return (f"nodeCount * ranksPerNode = {max(info.nodeCount, 1) * info.ranksPerNode} ranks is above this "
                f"controller's limit of {max_ranks} (--max-ranks)")
    return ""


def check_status(status: recover_pb2.Status) -> str:
    return _str("status.info", status.info)


def check_stop_complete(req: recover_pb2.StopCompleteRequest) -> str:
    return (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank)]) or check_status(req.status)
            or check_faults(req.faultRanks))


def check_recover_strategy(req: recover_pb2.RecoverStrategyRequest) -> str:
    return (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank)]) or check_faults(req.faultRanks)
            or check_strategies(req.strategies))


def check_recover_status(req: recover_pb2.RecoverStatusRequest) -> str:
    why = (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank)]) or check_status(req.status)
           or _list("isolateRankIds", req.isolateRankIds))
    if why:
        return why
    if req.strategy and req.strategy not in Strategy.KNOWN:
        return f"strategy {req.strategy[:64]!r} is not a known strategy ({', '.join(Strategy.KNOWN)})"
    for i, r in enumerate(req.isolateRankIds):
        if why := _rank_id(f"isolateRankIds[{i}]", r):
            return why
    return ""


def check_process_fault(req: recover_pb2.ProcessFaultRequest) -> str:
    return (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank)]) or _str("detail", req.detail)
            or check_faults(req.faultRanks, required=True))


def check_finish(job_id: str, node_rank: int, message: str) -> str:
    return check_job_id(job_id) or _non_negative([("nodeRank", node_rank)]) or _str("message", message)


def check_snapshots(req: taskd_pb2.SnapshotReport) -> str:
    """A snapshot report: its job, node and identity, an address, steps >= -1 and a finite lag >= 0."""
    why = (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank), ("pid", req.pid)])
           or _str("host", req.host) or _str("address", req.address))
    if why:
        return why
    for name in ("newestStep", "replicatedStep", "wardNodeRank", "wardStep"):
        if getattr(req, name) < -1:
            return f"{name} must be >= -1, got {getattr(req, name)}"
    if not math.isfinite(req.lagSeconds) or req.lagSeconds < 0:
        return f"lagSeconds must be finite and >= 0, got {req.lagSeconds}"
    for name, what in (("rankNewest", "ranks"), ("wards", "nodes")):
        table = getattr(req, name)
        if len(table) > RANK_LIMIT:
            return f"{name} names {len(table)} {what}, more than {RANK_LIMIT}"
        bad = sorted((key, step) for key, step in table.items() if key < 0 or step < -1)
        if bad:
            return f"{name} needs {what} >= 0 and steps >= -1, got {dict(bad)}"
    return ""


def check_pace(req: taskd_pb2.PaceRequest, max_ranks: int = RANK_LIMIT) -> str:
    """A pace report: its job, node and identity, a factor above 1, and per rank a non-negative finite compute
    time and step count, each rank once (whether the ranks are the node's own is `rank_refusal`'s)."""
    why = (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank), ("pid", req.pid)])
           or _str("host", req.host) or _list("ranks", req.ranks))
    if why:
        return why
    if why := check_factor(req.factor):
        return f"factor {why}"
    if len(req.ranks) > max_ranks:
        return f"ranks has {len(req.ranks)} entries, more than the {max_ranks} ranks a job may have"
    seen: set[int] = set()
    for i, r in enumerate(req.ranks):
        if r.rank < 0 or r.rank in seen:
            return f"ranks[{i}].rank {r.rank} is {'negative' if r.rank < 0 else 'listed twice'}"
        seen.add(r.rank)
        if not (0.0 <= r.computeSeconds < math.inf):
            return f"ranks[{i}].computeSeconds must be finite and >= 0, got {r.computeSeconds!r}"
        if r.steps < 0:
            return f"ranks[{i}].steps must be >= 0, got {r.steps}"
    return ""


def check_resumed(req: taskd_pb2.ResumedRequest) -> str:
    """A node's training-resumed report: its job, node and identity, a round number, non-negative finite times
    (whether the round is the job's is the state machine's to say: 401)."""
    why = (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank), ("pid", req.pid)])
           or _str("host", req.host))
    if why:
        return why
    if req.round < 1:
        return f"round must be >= 1 (the changeStrategy's extraParams round), got {req.round}"
    for name, value in (("seconds", req.seconds), ("secondsAgo", req.secondsAgo)):
        if not (0.0 <= value < math.inf):
            return f"{name} must be finite and >= 0, got {value!r}"
    for r in req.restores:
        if r.source not in RESTORE_SOURCES or r.rank < 0 or r.step < -1 or r.stepsRedone < -1:
            return (f"restores: rank {r.rank} source {r.source!r} step {r.step} stepsRedone {r.stepsRedone}: the "
                    f"source must be one of {', '.join(RESTORE_SOURCES)}, the rank >= 0, the steps >= -1")
    return ""


def world_size(node_count: int, ranks_per_node: int) -> int | None:
    """Ranks in the job, when its Init said how many per node (ClusterD-wire clients do not)."""
    return max(node_count, 1) * ranks_per_node if ranks_per_node > 0 else None


def rank_refusal(ranks: Sequence[int], name: str, world: int | None, node: tuple[int, int] | None = None,
                 max_ranks: int | None = None) -> tuple[int, str]:
    """(0, "") or (code, why) for ranks a job does not have: more entries than its world size (409), a rank
    outside the job (402) or, for `node` = (node rank, its ranks per node), outside that node's ranks (402).
    A job whose size is unknown (no ranksPerNode) is held to `max_ranks` (--max-ranks) instead."""
    if world is None and max_ranks is not None:
        if len(ranks) > max_ranks:
            return 409, (f"{name} has {len(ranks)} entries, more than this controller's --max-ranks {max_ranks} "
                         "(the job's Init gave no ranksPerNode, so that is its bound)")
        for i, r in enumerate(ranks):
            if r >= max_ranks:
                return 402, (f"{name}[{i}] = rank {r} is not below this controller's --max-ranks {max_ranks} "
                             "(the job's Init gave no ranksPerNode, so that is its bound)")
    if world is not None and len(ranks) > world:
        return 409, f"{name} has {len(ranks)} entries, more than the job's {world} ranks"
    for i, r in enumerate(ranks):
        if world is not None and r >= world:
            return 402, f"{name}[{i}] = rank {r} is not in the job: it has ranks 0-{world - 1}"
        if node is not None and node[1] > 0 and not node[0] * node[1] <= r < (node[0] + 1) * node[1]:
            first = node[0] * node[1]
            return 402, (f"{name}[{i}] = rank {r} is not one of node {node[0]}'s ranks ({first}-{first + node[1] - 1}):"
                         " a node reports only its own ranks' faults")
    return 0, ""


def rank_list(faults: Iterable[recover_pb2.FaultRank]) -> list[int]:
    """Validated FaultRank messages' ranks, repeats kept (a list longer than the job is refused as such)."""
    return [int(f.rankId) for f in faults]


def faults_dict(faults: Iterable[recover_pb2.FaultRank]) -> dict[int, str]:
    """Validated FaultRank messages as {rank: type}."""
    return {int(f.rankId): f.faultType for f in faults}
