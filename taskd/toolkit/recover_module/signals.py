"""Old path of the signal and fault-rank conversions; the code lives in taskd.client.signals."""

from taskd.client.signals import (
    InvalidFaultRanks,
    RecoverSignal,
    fault_ranks_from_proto,
    fault_ranks_to_proto,
    parse_signal,
)

__all__ = ["InvalidFaultRanks", "RecoverSignal", "fault_ranks_from_proto", "fault_ranks_to_proto", "parse_signal"]
