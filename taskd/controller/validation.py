"""Request checks: each returns "" or an info naming the offending field (answered 409)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from taskd.proto import recover_pb2
from taskd.vocabulary import FaultType, Strategy

MAX_LIST = 100_000
MAX_STRING = 4096


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
    if not job_id:
        return "jobId is empty"
    return _str("jobId", job_id)


def _non_negative(pairs: Iterable[tuple[str, int]]) -> str:
    for name, value in pairs:
        if value < 0:
            return f"{name} must be >= 0, got {value}"
    return ""


def _rank_id(name: str, text: str) -> str:
    if not text.isascii() or not text.isdigit():
        return f"{name} {text[:64]!r} is not a non-negative integer"
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
    if why := _list(field, names):
        return why
    for i, s in enumerate(names):
        if s not in Strategy.ORDER:
            return f"{field}[{i}] {s[:64]!r} is not a known strategy ({', '.join(Strategy.ORDER)})"
    return ""


def check_client(info: recover_pb2.ClientInfo) -> str:
    return (
        check_job_id(info.jobId)
        or _strings([("role", info.role), ("host", info.host)])
        or _non_negative([("nodeRank", info.nodeRank), ("nodeCount", info.nodeCount),
                          ("ranksPerNode", info.ranksPerNode), ("pid", info.pid)]
                         + ([("maxRestarts", info.maxRestarts)] if info.HasField("maxRestarts") else []))
        or check_strategies(info.strategies)
    )


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
    if req.strategy and req.strategy not in Strategy.ORDER:
        return f"strategy {req.strategy[:64]!r} is not a known strategy ({', '.join(Strategy.ORDER)})"
    for i, r in enumerate(req.isolateRankIds):
        if why := _rank_id(f"isolateRankIds[{i}]", r):
            return why
    return ""


def check_process_fault(req: recover_pb2.ProcessFaultRequest) -> str:
    return (check_job_id(req.jobId) or _non_negative([("nodeRank", req.nodeRank)]) or _str("detail", req.detail)
            or check_faults(req.faultRanks, required=True))


def check_finish(job_id: str, node_rank: int, message: str) -> str:
    return check_job_id(job_id) or _non_negative([("nodeRank", node_rank)]) or _str("message", message)


def faults_dict(faults: Iterable[recover_pb2.FaultRank]) -> dict[int, str]:
    """Validated FaultRank messages as {rank: type}."""
    return {int(f.rankId): f.faultType for f in faults}
