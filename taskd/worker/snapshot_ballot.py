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


def to_row(values: set[int], rank: int, world: int) -> Any:
    """``values`` as this rank's row of a (world, SLOTS, 1 + pieces) float32 numpy array, zeros elsewhere: summed over
    the ranks (MindSpore's CPU AllReduce, which only sums float32) it holds every rank's set, read by
    `common_of_rows`. A slot is (1, the value + OFFSET in 21-bit pieces), so the ballot's negative marks fit."""
    import numpy as np  # inside: taskd.worker needs only the standard library to import

    if len(values) > SLOTS:
        raise ValueError(f"{len(values)} values to agree on: at most {SLOTS}")
    rows = np.zeros((world, SLOTS, 1 + _PIECES), dtype=np.float32)
    for slot, value in enumerate(sorted(values)):
        shifted = value + _OFFSET
        if not 0 <= shifted < _PIECE ** _PIECES:
            raise ValueError(f"{value} cannot be agreed on: outside [-{_OFFSET}, 2**63 - {_OFFSET})")
        rows[rank, slot, 0] = 1.0
        for piece in range(_PIECES):
            rows[rank, slot, 1 + piece] = float((shifted // _PIECE ** piece) % _PIECE)
    return rows


def common_of_rows(rows: Any) -> set[int]:
    """The values every rank's row holds (the intersection `agree` returns), from the summed rows."""
    sets = []
    for row in rows:
        sets.append({sum(int(slot[1 + piece]) * _PIECE ** piece for piece in range(_PIECES)) - _OFFSET
                     for slot in row if slot[0] == 1.0})
    return set.intersection(*sets) if sets else set()


__all__ = ["RANK_BITS", "SLOTS", "ballot", "common_of_rows", "failing_rank", "outvoted", "to_row"]
