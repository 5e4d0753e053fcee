"""A snapshot vote's ballot: the step, and the number of the rank whose copy failed, in one set of ints.

A set of ints goes through any ``agree`` (an intersection of the ranks' sets): the step when this rank's copy
passed, and the failing rank's number spelt in RANK_BITS bit marks (negative ints, never a step). A passing rank
marks both values of every bit, a failing rank only its own rank's: in the intersection each bit keeps one mark when
exactly one rank failed (its number), none when several did. So a passing rank's line names the rank whose copy
failed (the memory cut's vote, `snapshot_vote`, and the persisted copies' agreed cut, `snapshot_persist`).
"""

from __future__ import annotations

from typing import Any

RANK_BITS = 24
"""Bits of a failing rank's number the ballot carries (16M ranks): 48 small ints in each vote."""


def _mark(bit: int, value: int) -> int:
    return -1 - 2 * bit - value


def ballot(ok: bool, step: int, rank: int) -> set[int]:
    """A rank's ballot on ``step``: the step and every bit mark when its copy passed, else its own rank's marks."""
    if ok:
        return {step} | {_mark(bit, value) for bit in range(RANK_BITS) for value in (0, 1)}
    return {_mark(bit, (rank >> bit) & 1) for bit in range(RANK_BITS)}


PERSISTS = -1
"""The memory cut's mark (never a step) of a rank with persisted copies to offer (TASKD_SNAPSHOT_PERSIST_DIR): the
cut's intersection keeps it only when every rank has them, so every rank goes on to the persisted copies' agreed
cut (more collectives) or none does, decided by the same collective on every rank."""


def cut_offer(steps: set[int], persists: bool) -> set[int]:
    """A rank's part in the memory cut: the steps it holds (none when its snapshots are off), and `PERSISTS`."""
    return steps | {PERSISTS} if persists else set(steps)


def cut_answer(common: set[int]) -> tuple[set[int], bool]:
    """The steps every rank holds, and whether every rank has persisted copies, from the cut's intersection."""
    return {s for s in common if s >= 0}, PERSISTS in common


def failing_rank(voted: set[int]) -> int | None:
    """The one rank whose copy failed, read from the ballots' intersection; None when several (or none) failed."""
    rank = 0
    for bit in range(RANK_BITS):
        zero, one = _mark(bit, 0) in voted, _mark(bit, 1) in voted
        if zero == one:  # both: no rank failed; neither: failing ranks differ in this bit
            return None
        rank |= one << bit
    return rank


def outvoted(step: int, voted: set[int], copy: str = "snapshot") -> str:
    """The words of a passing rank's line for ``step``, which ``voted`` (the intersection) did not keep."""
    failed = failing_rank(voted)
    if failed is None:
        return f"step {step}: several ranks' {copy}s fail their check (their lines say why)"
    return f"step {step}: rank {failed}'s {copy} fails its check (its line says why)"


SLOTS = 128
"""Values a rank's set may hold in a sum-only collective's row (a ballot: 49; a cut: its published steps)."""
_PIECE, _PIECES, _OFFSET = 1 << 21, 3, 1 << 16  # float32 holds integers exactly to 2**24: 21-bit pieces

# Intersecting every rank's set through MindSpore's CPU AllReduce (which only sums float32) in two sums of a few KB
# whatever the world size (one (world, SLOTS, 4) array summed was 8 MB at 4,096 ranks): rank 0 offers its set
# (`offer`: its row, every other rank's zeros), each rank then says which of those values it holds (`holds`), and a
# value every rank holds is in the intersection (`common`): no value outside rank 0's set can be.


def offer(values: set[int], rank: int) -> Any:
    """Rank 0's ``values`` as a (SLOTS, 1 + pieces) float32 numpy array, zeros from every other rank: summed over
    the ranks it is rank 0's set, read by `offered`. A slot is (1, the value + OFFSET in 21-bit pieces), so the
    ballot's negative marks fit; ValueError for a set no rank could offer (checked on every rank alike)."""
    import numpy as np  # inside: taskd.worker needs only the standard library to import

    if len(values) > SLOTS:
        raise ValueError(f"{len(values)} values to agree on: at most {SLOTS}")
    row = np.zeros((SLOTS, 1 + _PIECES), dtype=np.float32)
    for slot, value in enumerate(sorted(values)):
        shifted = value + _OFFSET
        if not 0 <= shifted < _PIECE ** _PIECES:
            raise ValueError(f"{value} cannot be agreed on: outside [-{_OFFSET}, 2**63 - {_OFFSET})")
        if rank == 0:
            row[slot, 0] = 1.0
            for piece in range(_PIECES):
                row[slot, 1 + piece] = float((shifted // _PIECE ** piece) % _PIECE)
    return row


def offered(row: Any) -> list[int]:
    """Rank 0's values, slot by slot, from the summed `offer` rows."""
    return [sum(int(slot[1 + piece]) * _PIECE ** piece for piece in range(_PIECES)) - _OFFSET
            for slot in row if slot[0] == 1.0]


def holds(candidates: list[int], values: set[int]) -> Any:
    """A (SLOTS,) float32 numpy array: 1 in each slot of ``candidates`` (rank 0's offer) that ``values`` holds too."""
    import numpy as np

    row = np.zeros(SLOTS, dtype=np.float32)
    for slot, value in enumerate(candidates):
        row[slot] = 1.0 if value in values else 0.0
    return row


def common(candidates: list[int], counts: Any, world: int) -> set[int]:
    """The values every one of the ``world`` ranks holds (the intersection `agree` returns), from the summed
    `holds` rows (counts exact in float32 up to 2**24 ranks)."""
    return {value for slot, value in enumerate(candidates) if int(counts[slot]) == world}


__all__ = ["PERSISTS", "RANK_BITS", "SLOTS", "ballot", "common", "cut_answer", "cut_offer", "failing_rank", "holds",
           "offer", "offered", "outvoted"]
