"""A planned migration as a rank sees it (control action ``migrate``; docs/worker.md, "Planned migration").

The agent writes ``migrate`` of generation g, naming the ranks that leave (``leaving``: started-as ranks) once their
successors wait in ``LiveGroup()`` (prepared warm spares). The ranks must all leave generation g-1 at the *same*
step boundary, or a rank already inside that step would block on a peer that left and lose the step. So the boundary
is named in the rendezvous store, once every rank has seen the request: each rank counts itself in (``add``) at the
first boundary it sees it, and the rank whose count completes the world names the boundary after its next step
(``compare_set``: the first writer wins). Every other rank is at most that far: a rank past it would have completed
a step whose all-reduce the namer has not yet joined, and every rank has seen the request, so it reads the store at
that boundary. Counting first matters across nodes: each node's ranks read their own node's control file, and a rank
whose file came late would have passed a boundary named before it knew of it. At that boundary the staying ranks
re-form generation g with the successors (a survivor hands them the replicated state, as in a recovery), and a
leaving rank leaves its group and waits for the agent's word: ``release`` of g (its successor joined: it exits 0) or
a newer generation (the migration was called off: it rejoins as itself). A node migration (``node`` in the request:
every rank of a node moves to a standby agent's) has no agent that adopts the successors on the leaving node, so its
leaving ranks are released by the store instead: every rank that joined g counts itself in (``JOINED_KEY``), and
once all of g's ranks have, the group formed without them.
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
SEEN_KEY = "taskd/migrate{generation}/seen"  # how many ranks have seen the request
JOINED_KEY = "taskd/migrate{generation}/joined"  # how many ranks joined generation g (a node migration's release)
RELEASE_POLL = 0.05


class MigrationFailed(RuntimeError):
    """A leaving rank heard nothing from its agent in time: it exits with this error (the agent answers first)."""


def leaving(control: Control) -> frozenset[int]:
    """The started-as ranks a ``migrate`` request moves to their successors (malformed entries ignored)."""
    ranks = control.extra.get("leaving", [])
    if not isinstance(ranks, list):
        return frozenset()
    return frozenset(r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r >= 0)


def is_node_move(control: Control) -> bool:
    """Whether ``control`` moves a whole node (its leaving ranks are released by the store, not by their agent)."""
    return control.extra.get("node") is True


def boundary(store: Any, control: Control, step: int, world_size: int, counted: bool) -> int | None:
    """The step before which every rank leaves for ``control``'s generation, asked at the boundary before ``step``;
    None while not every one of the ``world_size`` ranks has seen the request. ``counted``: this rank counted
    itself in at an earlier boundary (each rank counts once). The rank whose count completes the world names
    ``step + 1``; everyone else reads that."""
    seen = store.add(SEEN_KEY.format(generation=control.generation), 0 if counted else 1)
    if seen < world_size:
        return None
    key = BOUNDARY_KEY.format(generation=control.generation)
    value = store.compare_set(key, "", str(step + 1))
    return int(value.decode() if isinstance(value, bytes) else value)


def names_node_move(control: Control | None, generation: int) -> bool:
    """Whether ``control``, the request a rank joined ``generation`` for, names a node migration of it: every
    joining rank reads it (the staying ranks' ``migrate`` and the successors', written by their standby agent)."""
    return control is not None and control.generation == generation and control.action == MIGRATE \
        and is_node_move(control)


def count_joined(store: Any, control: Control | None, generation: int) -> bool:
    """A rank past the state sync of ``generation`` counts itself in for a node migration's leaving ranks, and only
    then: a store round trip to node 0 on every join of every recovery was work for nobody. Whether it counted."""
    if not names_node_move(control, generation):
        return False
    store.add(JOINED_KEY.format(generation=generation), 1)
    return True


def await_group(store: Any, watch: ControlWatch, generation: int, world_size: int, timeout: float) -> Control | None:
    """A node migration's leaving rank: the group of ``generation`` formed without it (every one of its
    ``world_size`` ranks joined: the ``release`` returned), or a newer generation was named (the migration was
    called off: it rejoins as itself); None after ``timeout``."""
    deadline = time.monotonic() + timeout
    key = JOINED_KEY.format(generation=generation)
    while True:
        control = watch.latest()
        if control is not None and control.generation > generation and control.action != "leave":
            return control
        if store.add(key, 0) >= world_size:
            return Control(generation, RELEASE)
        if time.monotonic() >= deadline:
            return None
        time.sleep(RELEASE_POLL)


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


__all__ = ["BOUNDARY_KEY", "JOINED_KEY", "MIGRATE", "MigrationFailed", "RELEASE", "SEEN_KEY", "await_group",
           "await_release", "boundary", "count_joined", "is_node_move", "leaving",
           "names_node_move"]
