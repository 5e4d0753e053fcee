"""The in-memory cut's vote: every rank restores the same step, or every rank passes it over together.

Each rank checks only its own copy of the step the cut picked (its load's CRC, which the restore pays anyway),
then the ranks vote through the same ``agree`` the cut uses (`snapshot_persist`'s agreed cut does the same for
the persisted copies): the step stands only if every copy passed, else every rank tries the next older one.
Nothing is loaded into the caller's objects before the vote (it runs inside ``use``, after the checksum). Without
a channel (one node, no ``agree`` or no torch.distributed yet) each rank checks every rank's copy of the step
instead: the same answer on every rank without talking, at the cost of a CRC over each copy.

The ballot (`snapshot_ballot`) carries the failing rank's number too, so every rank's line names it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskd.worker.snapshot_ballot import ballot, outvoted
from taskd.worker.snapshot_files import segment_name
from taskd.worker.snapshot_persist import verify
from taskd.worker.snapshot_segment import SnapshotError, load

log = logging.getLogger(__name__)



class Outvoted(Exception):
    """Another rank's copy of the step failed its check: this rank passes the step over too (the reason in args)."""


class Unagreed(Exception):
    """The ranks of several nodes cannot vote (``agree`` failed): no step of the memory cut can be taken."""


@dataclass(frozen=True)
class Vote:
    """A rank's part in the vote on a step of the memory cut. ``agree`` as `Snapshots`'s (None: no channel);
    ``directory``: the job's snapshot directory (``rank<R>/s<step>.snap``), read when there is no channel.
    ``alone``: scope "rank" (ranks that exchange no state, each restoring its own newest): no vote."""

    agree: Callable[[set[int]], set[int]] | None
    rank: int
    world: int
    nodes: int
    directory: str
    alone: bool = False

    def cast(self, ok: bool, step: int) -> set[int] | None:
        """The vote's outcome (a collective): the intersection of the ranks' ballots (`ballot`: ``step`` in it
        when every copy passed); None: no channel (one node only)."""
        if self.alone:
            return ballot(ok, step, self.rank)
        if self.agree is None:
            if self.nodes > 1:
                raise Unagreed("the job runs on several nodes and nothing agrees on a step (`agree`)")
            return None
        try:
            return set(self.agree(ballot(ok, step, self.rank)))
        except SnapshotError as exc:
            if self.nodes > 1:
                raise Unagreed(str(exc)) from exc
            return None  # one node before init_process_group: every rank checks every copy instead

    def confirm(self, step: int) -> None:
        """This rank's copy of ``step`` passed its check: Outvoted when another rank's did not."""
        voted = self.cast(True, step)
        if voted is not None and step not in voted:
            raise Outvoted(outvoted(step, voted))
        if voted is None:
            for other in range(self.world):
                path = os.path.join(self.directory, f"rank{other}", segment_name(step))
                why = verify(path, step, other) if other != self.rank else ""
                if why:
                    raise Outvoted(f"step {step}: rank {other}'s snapshot fails its check ({why})")

    def reject(self, step: int, why: str) -> str:
        """This rank's copy of ``step`` failed its check: vote against it (every rank passes it over) and say so
        in one line; returns the words for the restore's line."""
        words = f"step {step}: rank {self.rank}'s snapshot fails its check ({why})"
        log.warning("rank %d: its snapshot of step %d in memory fails its check (%s): %s passes over step %d and "
                    "tries the next older one", self.rank, step, why, "it" if self.alone else "every rank of the job",
                    step)
        self.cast(False, step)
        return words


def load_voted(vote: Vote, path: str, step: int, use: Callable[[Any], Any] | None) -> tuple[Any, int]:
    """This rank's snapshot of ``step`` at ``path`` (as `load`), taken only when every rank's copy passed its check:
    the vote runs after this rank's checksum and before ``use`` applies anything; Outvoted otherwise."""
    voted = False
    apply = guarded(use)

    def confirmed(state: Any) -> Any:
        nonlocal voted
        voted = True
        vote.confirm(step)
        return state if apply is None else apply(state)

    try:
        if use is None:  # the state is a copy of its own: vote once it is read
            found = load(path, step, vote.rank)
            voted = True
            vote.confirm(step)
            return found
        return load(path, step, vote.rank, confirmed)
    except (SnapshotError, OSError) as exc:
        if voted:  # this rank's copy passed: not its own check's error
            raise
        raise Outvoted(vote.reject(step, str(exc))) from None


class InUse(Exception):
    """An error raised by restore's ``use`` (its cause), kept apart from a segment that cannot be read."""


def guarded(use: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    """``use`` with its own SnapshotError and OSError wrapped in InUse: never taken for a damaged snapshot."""
    if use is None:
        return None

    def run(state: Any) -> Any:
        try:
            return use(state)
        except (SnapshotError, OSError) as exc:
            raise InUse() from exc
    return run


__all__ = ["InUse", "Outvoted", "Unagreed", "Vote", "guarded", "load_voted"]
