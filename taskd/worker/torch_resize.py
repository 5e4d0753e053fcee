"""A live group that changes size (issue 17: scale-in and scale-out), the rank's side.

A script that passes ``LiveGroup(on_resize=fn)`` declares that its ranks can go on at another world size
(heartbeat flag ``FLAG_RESIZE``): its agent then offers ``downgrade``/``upgrade``. When the controller chooses
one, the control file of the next generation carries ``world_size`` and each rank's new rank, by the global
rank its process was started as (RANK never changes for a process). `Resize` keeps that mapping: the group
re-forms at the new rank and size, and ``fn(rank, world_size)`` runs in every rank whose rank or world size
changed, once the group is formed and the state synced, before its next step: that is where the script
re-shards its data (docs/node-loss.md, "Scale-in and scale-out").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from taskd.worker.live import Control, LiveProtocolError

log = logging.getLogger(__name__)

ResizeHook = Callable[[int, int], object]


class Resize:
    """This rank's place in a group whose size may change, and the hook it owes the script."""

    def __init__(self, hook: ResizeHook | None, started_as: int, rank: int, world_size: int) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"on_resize must be callable as on_resize(rank, world_size), got {hook!r}")
        self.hook = hook
        self.started_as = started_as  # RANK at process start: the key of the control file's rank map
        self.last = (rank, world_size)  # what the script last knew (its start, or the last hook call)

    @property
    def declared(self) -> bool:
        return self.hook is not None

    def place(self, control: Control | None, rank: int, world_size: int) -> tuple[int, int]:
        """(rank, world size) to form the group of ``control`` with: the control file's for a resize, else as is.
        A resize that does not name this rank is a protocol error (the agent names every rank of its node)."""
        if control is None or control.world_size is None:
            return rank, world_size
        if self.hook is None:
            raise LiveProtocolError(f"generation {control.generation} resizes the group to {control.world_size} "
                                    "ranks, but this script has no on_resize hook (LiveGroup(on_resize=...))")
        new = control.rank_of(self.started_as)
        if new is None:
            raise LiveProtocolError(f"generation {control.generation} resizes the group to {control.world_size} "
                                    f"ranks but names no rank for the one started as rank {self.started_as}")
        return new, control.world_size

    def owed(self, rank: int, world_size: int) -> bool:
        return self.hook is not None and (rank, world_size) != self.last

    def run(self, rank: int, world_size: int) -> None:
        """Call the script's hook if its rank or world size changed since it last knew them."""
        if not self.owed(rank, world_size):
            return
        before, self.last = self.last, (rank, world_size)
        log.info("rank %d (started as %d): world size %d -> %d (was rank %d); on_resize runs", rank,
                 self.started_as, before[1], world_size, before[0])
        self.hook(rank, world_size)  # type: ignore[misc]


__all__ = ["Resize", "ResizeHook"]
