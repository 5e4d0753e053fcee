"""A planned migration as a rank sees it (control action ``migrate``; docs/worker.md, "Planned migration").

The agent writes ``migrate`` of generation g, naming the ranks that leave (``leaving``: started-as ranks) once
their successors wait in ``LiveGroup()`` (prepared warm spares). The ranks must all leave generation g-1 at
the *same* step boundary, or a rank already inside that step would block on a peer that left and lose the step.
So the first rank to see the request names the boundary in the rendezvous store: the one after its next step
(``compare_set``: the first writer wins). Every other rank is at most that far: a rank past it would have
completed a step whose all-reduce the namer has not yet joined. At that boundary the staying ranks re-form
generation g with the successors (a survivor hands them the replicated state, as in a recovery), and a
leaving rank leaves its group and waits for the agent's word: ``release`` of g (its successor joined: it exits
0) or a newer generation (the migration was called off: it rejoins as itself).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from taskd.worker.control_file import Control, ControlWatch
from taskd.worker.file_events import FileWatch

log = logging.getLogger(__name__)

MIGRATE = "migrate"
RELEASE = "release"
BOUNDARY_KEY = "taskd/migrate{generation}/step"


class MigrationFailed(RuntimeError):
    """A leaving rank heard nothing from its agent in time: it exits with this error (the agent answers first)."""


def leaving(control: Control) -> frozenset[int]:
    """The started-as ranks a ``migrate`` request moves to their successors (malformed entries ignored)."""
    ranks = control.extra.get("leaving", [])
    if not isinstance(ranks, list):
        return frozenset()
    return frozenset(r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r >= 0)


def boundary(store: Any, control: Control, step: int) -> int:
    """The step before which every rank leaves for ``control``'s generation: the first rank to ask (at the
    boundary before ``step``) names ``step + 1``; everyone else reads that."""
    key = BOUNDARY_KEY.format(generation=control.generation)
    value = store.compare_set(key, "", str(step + 1))
    return int(value.decode() if isinstance(value, bytes) else value)


def await_release(watch: ControlWatch, generation: int, timeout: float) -> Control | None:
    """A leaving rank's wait: ``release`` of ``generation`` (it may exit) or a newer generation (rejoin as itself,
    or abort); None after ``timeout``."""
    deadline = time.monotonic() + timeout
    with FileWatch(watch.path, 0.005, 0.05) as files:
        while True:
            control = watch.latest()
            if control is not None and control.action != "leave" and (control.generation > generation or
                                        (control.generation == generation and control.action == RELEASE)):
                return control
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            files.pause(left)


__all__ = ["BOUNDARY_KEY", "MIGRATE", "MigrationFailed", "RELEASE", "await_release", "boundary", "leaving"]
