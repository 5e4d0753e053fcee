"""A snapshot vote's ballot: the step, and the number of the rank whose copy failed, in one set of ints.

A set of ints goes through any ``agree`` (an intersection of the ranks' sets): the step when this rank's copy
passed, and the failing rank's number spelt in RANK_BITS bit marks (negative ints, never a step). A passing rank
marks both values of every bit, a failing rank only its own rank's: in the intersection each bit keeps one mark when
exactly one rank failed (its number), none when several did. So a passing rank's line names the rank whose copy
failed (the memory cut's vote, `snapshot_vote`, and the persisted copies' agreed cut, `snapshot_persist`).
"""

from __future__ import annotations

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


__all__ = ["RANK_BITS", "ballot", "failing_rank", "outvoted"]
