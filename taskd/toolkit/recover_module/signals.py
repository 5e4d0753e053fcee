"""Typed views of the wire messages: `ProcessManageSignal` in, `FaultRank` lists out.

On the wire every rank, fault type and node rank is a string (ClusterD's choice); handlers and
callers work with ints, so the conversion lives in one place and rejects what is not a number.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from taskd.proto import recover_pb2

logger = logging.getLogger(__name__)


class InvalidFaultRanks(ValueError):
    """A `{rank: fault_type}` mapping that cannot be put on the wire."""


@dataclass
class RecoverSignal:
    """One `ProcessManageSignal`, parsed for a handler."""

    uuid: str
    job_id: str
    signal_type: str
    actions: list[str]
    fault_ranks: dict[int, int]
    strategy: str
    timeout: int
    node_ranks: list[int]
    extra_params: str
    raw: recover_pb2.ProcessManageSignal = field(repr=False, compare=False)


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidFaultRanks(f"{what} must be an integer, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidFaultRanks(f"{what} must be an integer, got {value!r}") from None
    if number < 0:
        raise InvalidFaultRanks(f"{what} must not be negative, got {value!r}")
    return number


def fault_ranks_to_proto(fault_ranks: Mapping[object, object] | None) -> list[recover_pb2.FaultRank]:
    """`{rank: type}` (ints or numeric strings) -> FaultRank messages, sorted by rank."""
    if fault_ranks is None:
        return []
    if not isinstance(fault_ranks, Mapping):
        raise InvalidFaultRanks(f"fault_ranks must be a dict {{rank: fault_type}}, got {type(fault_ranks).__name__}")
    pairs = sorted((_as_int(r, "rank"), _as_int(t, f"fault type of rank {r!r}")) for r, t in fault_ranks.items())
    return [recover_pb2.FaultRank(rankId=str(rank), faultType=str(kind)) for rank, kind in pairs]


def fault_ranks_from_proto(items: Iterable[recover_pb2.FaultRank]) -> dict[int, int]:
    """FaultRank messages -> `{rank: type}`; an entry that is not numeric is logged and skipped."""
    out: dict[int, int] = {}
    for item in items:
        try:
            out[_as_int(item.rankId, "rankId")] = _as_int(item.faultType or "1", "faultType")
        except InvalidFaultRanks as exc:
            logger.warning("skipping fault rank %r/%r in signal: %s", item.rankId, item.faultType, exc)
    return out


def parse_signal(message: recover_pb2.ProcessManageSignal) -> RecoverSignal:
    """Parse a signal without ever raising: malformed entries are logged and dropped."""
    node_ranks: list[int] = []
    for text in message.nodeRankIds:
        try:
            node_ranks.append(_as_int(text, "nodeRankId"))
        except InvalidFaultRanks as exc:
            logger.warning("skipping node rank in signal %s: %s", message.uuid, exc)
    return RecoverSignal(
        uuid=message.uuid,
        job_id=message.jobId,
        signal_type=message.signalType,
        actions=list(message.actions),
        fault_ranks=fault_ranks_from_proto(message.faultRanks),
        strategy=message.changeStrategy,
        timeout=int(message.timeout),
        node_ranks=node_ranks,
        extra_params=message.extraParams,
        raw=message,
    )
