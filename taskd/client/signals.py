"""Typed views of the wire messages: `ProcessManageSignal` in, `FaultRank` lists out.

On the wire every rank, fault type and node rank is a string (ClusterD's choice). Outgoing fault
ranks go through `taskd.vocabulary.fault_ranks` (the one `FaultRanks` type); incoming signals are
parsed leniently, because a malformed entry from the controller must not cost the agent the signal.
Handlers get TaskD's shape, `{rank: int fault type}`, and `RecoverSignal.faults` as `FaultRanks`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from taskd.client.arguments import BadArgument, report_fault_ranks
from taskd.proto import recover_pb2
from taskd.vocabulary import FaultRanks

logger = logging.getLogger(__name__)

InvalidFaultRanks = BadArgument  # the name this module's exception had before the client package


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

    @property
    def faults(self) -> FaultRanks:
        """`fault_ranks` as `taskd.vocabulary.FaultRanks` (the wire's string fault types)."""
        return {rank: str(kind) for rank, kind in self.fault_ranks.items()}


def _wire_int(text: str, what: str) -> int:
    value = text.strip()
    if not value.isdigit():
        raise ValueError(f"{what} must be a non-negative integer, got {text!r}")
    return int(value)


def fault_ranks_to_proto(fault_ranks: object) -> list[recover_pb2.FaultRank]:
    """TaskD-style `{rank: 0|1|2}` (or `FaultRanks`) -> FaultRank messages, sorted by rank; BadArgument otherwise."""
    ranks = report_fault_ranks(fault_ranks)
    return [recover_pb2.FaultRank(rankId=str(rank), faultType=kind) for rank, kind in sorted(ranks.items())]


def fault_ranks_from_proto(items: Iterable[recover_pb2.FaultRank]) -> dict[int, int]:
    """FaultRank messages -> `{rank: type}` (empty type: 1); a non-numeric entry is logged and skipped."""
    out: dict[int, int] = {}
    for item in items:
        try:
            out[_wire_int(item.rankId, "rankId")] = _wire_int(item.faultType or "1", "faultType")
        except ValueError as exc:
            logger.warning("skipping fault rank %r/%r in signal: %s", item.rankId, item.faultType, exc)
    return out


def parse_signal(message: recover_pb2.ProcessManageSignal) -> RecoverSignal:
    """Parse a signal without ever raising: malformed entries are logged and dropped."""
    node_ranks: list[int] = []
    for text in message.nodeRankIds:
        try:
            node_ranks.append(_wire_int(text, "nodeRankId"))
        except ValueError as exc:
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
