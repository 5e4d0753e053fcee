"""A `LiveGroup`'s in-memory snapshots: what a whole-job restart of a live job restores, instead of a checkpoint.

A live job's faults are mostly recovered in place (the survivors keep their state, a replacement receives it),
but some restart every rank: node 0 lost (its agent hosted the store the group re-forms on), job-rescheduling
after a failed recover, the degraded local restart. ``LiveGroup(snapshot_every=k)`` then snapshots the state it
tracks (model, optimizer, the ``track``-ed objects, the `LiveLoader` positions) every k committed steps, into the
node's memory (`taskd.worker.snapshot`, copied to the buddy node by the agent), and a start where no rank holds
live state restores the newest step every rank holds in memory: the survivors' from their node, a lost node's
from the copy its replacement fetched from the buddy. Nothing is loaded until every rank said it holds that
step; otherwise every rank falls back to the script's ``load`` (its disk checkpoints), and the log says why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.env import in_spare
from taskd.worker.snapshot_account import Restored, read_restored, write_restored
from taskd.worker.snapshot_files import steps_in
from taskd.worker.torch_snapshot import ShardedSnapshots, Stateful, TorchSnapshots, is_sharded

log = logging.getLogger(__name__)


class LiveSnapshots:
    """A live group's snapshots every ``every`` committed steps (0: none), ``keep`` kept (more than the steps a
    buddy's copy lags, for a lost node: `taskd status` shows the lag). Off until `start` names the objects."""

    def __init__(self, every: int = 0, keep: int = 4) -> None:
        self.every, self.keep = checked_snapshot_options(every, keep)
        self.objects: list[Stateful] = []  # what the snapshot holds; a sharded model's: besides model and optimizer
        self.store: TorchSnapshots | ShardedSnapshots | None = None
        self.restored_from: str | None = None
        if self.every > 0 and in_spare():  # a warm spare imports now what a sharded model's restore needs, not
            import torch.distributed.checkpoint.state_dict  # noqa: F401  # after the fault (1-2 s under load)

    def start(self, objects: list[Any], sharded: str | None) -> None:
        """Once, at the group's first steps(): the tracked objects (model, optimizer, the rest; None left out). A
        sharded model (FSDP2, HSDP) and its optimizer go in as this rank's shards (`ShardedSnapshots`), the rest as
        the snapshot's ``extra``; nothing for a sharded model that live recovery does not take (``sharded``: why)."""
        if self.store is not None or self.every <= 0:
            return
        if sharded is not None:
            log.warning("LiveGroup(snapshot_every=...) is off for a sharded model (%s): snapshot its shards with "
                        "taskd.worker.torch_snapshot.ShardedSnapshots", sharded)
            self.every = 0
            return
        model, optimizer, *rest = objects
        if model is not None and is_sharded(model):
            self.objects = [o for o in rest if o is not None]
            self.store = ShardedSnapshots(model, optimizer, keep=self.keep)
            return
        self.objects = [o for o in objects if o is not None]
        self.store = TorchSnapshots(*self.objects, keep=self.keep)

    def save(self, step: int) -> None:
        """After a committed step: a snapshot every ``every`` steps (one memory copy, published in the background)."""
        if isinstance(self.store, ShardedSnapshots) and step % self.every == 0:
            self.store.save(step, extra=[o.state_dict() for o in self.objects])
        elif self.store is not None and step % self.every == 0:
            self.store.save(step, extra=step)  # the step, for `restore`'s check inside the load

    def roll_back(self) -> int | None:
        """Collective, sharded models only: load the newest step every rank of the group holds (agreed over the
        group: running ranks may still be publishing) into model, optimizer and objects; that step, or None."""
        if not isinstance(self.store, ShardedSnapshots):
            return None
        step = self.store.restore(agreed=True)
        self.restored_from = self.store.restored_from
        if self.restored_from is None:
            return None
        for obj, saved in zip(self.objects, self.store.extra or [], strict=True):
            obj.load_state_dict(saved)
        return step

    def newest_held(self) -> int:
        """This rank's newest step in its node's memory (its own segments, or those its agent fetched from the
        buddy); -1 for none. Not the restore's account: a lost node's rank is counted there from how far it got."""
        snapshots = self.store.snapshots if self.store is not None else None
        if snapshots is None or snapshots.directory is None:
            return -1
        return max(steps_in(os.path.join(snapshots.directory, f"rank{snapshots.rank}")), default=-1)

    def restore(self, rank: int, disk_step: int, device: torch.device) -> int | None:
        """Collective (every rank of the group calls it, all alike on or off): the step restored from memory into
        the objects, or None when the ranks fall back to ``disk_step`` (the newest checkpoint every rank has), said in
        the log. ``device``: where the group reduces its own tensors (`torch_facts.group_device`: NCCL's on CUDA)."""
        if self.store is None:
            return None
        if isinstance(self.store, ShardedSnapshots):
            step = self.roll_back()
            if step is not None and step >= disk_step:
                return step
            why = ("no step is held by every rank: the line above says why" if step is None
                   else f"the snapshots' step {step} is older than the disk checkpoints' {disk_step}")
            return self._fall_back(rank, disk_step, why, loud=step is not None or disk_step > 0)
        store, snapshots = self.store, self.store.snapshots
        steps: list[int] = []

        def load_if_every_rank_holds_it(state: dict[str, Any]) -> bool:
            """Inside the restore, over views of the mapped segment: loaded straight into the objects (one copy)
            only once every rank said it holds this step; a copy first, then a load, copied the state twice."""
            steps.extend(_gathered(state.get("extra") if isinstance(state.get("extra"), int) else -1, device))
            if len(set(steps)) == 1 and steps[0] >= disk_step:
                store.load_into(state)
                return True
            return False

        found = snapshots.restore(use=load_if_every_rank_holds_it)  # no fallback: its own copies only
        if not steps:  # nothing of its own restored: it takes part all the same
            steps = _gathered(-1, device)
        if found is not None and found[0] is True:
            self.restored_from = snapshots.restored_from
            return found[1]
        if min(steps) < 0:
            lacking = [r for r, s in enumerate(steps) if s < 0]
            why = f"rank(s) {', '.join(map(str, lacking))} of the group restore no snapshot"
        elif len(set(steps)) > 1:
            why = f"the ranks' snapshots are of different steps ({steps})"
        else:
            why = f"the snapshots' step {steps[0]} is older than the disk checkpoints' {disk_step}"
        return self._fall_back(rank, disk_step, why, loud=disk_step > 0 or max(steps) >= 0)

    def _fall_back(self, rank: int, disk_step: int, why: str, loud: bool) -> None:
        """No step restored from memory: say why, and tell the agent that the disk checkpoints are next."""
        assert self.store is not None
        snapshots = self.store.snapshots
        self.restored_from = "disk" if disk_step > 0 else None
        log.log(logging.WARNING if loud else logging.INFO,
                "rank %d: no step restored from memory (%s): falling back to the disk checkpoints: %s", rank, why,
                f"step {disk_step}" if disk_step > 0 else "none, starting afresh")
        said = read_restored(snapshots.directory, snapshots.rank)  # what the snapshots' restore told the agent
        write_restored(snapshots.directory, Restored(snapshots.rank, os.getpid(), self.restored_from or "none",
                                                     disk_step, said.newest if said is not None else -1))
        return None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _gathered(step: int, device: torch.device) -> list[int]:
    """Every rank's step (-1: none), from this rank's: a collective of the group."""
    mine = torch.tensor([step], dtype=torch.int64, device=device)
    table = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(table, mine)
    return [int(t[0]) for t in table]


def checked_snapshot_options(every: object, keep: object) -> tuple[int, int]:
    """``LiveGroup``'s ``snapshot_every`` and ``snapshot_keep``, or ValueError naming them."""
    if not (isinstance(every, int) and every >= 0 and isinstance(keep, int) and keep >= 2):
        raise ValueError(f"snapshot_every must be an integer >= 0 and snapshot_keep one >= 2, got {every!r} and "
                         f"{keep!r}")
    return every, keep


def start_afresh(memory: LiveSnapshots, rank: int, rows: Sequence[tuple[int, int]], loaders: Sequence[Any],
                 load: Callable[[int], object] | None, device: torch.device) -> int:
    """No rank holds live state (job start, whole-job restart): the step to start from, collectively. The newest step
    every rank holds in memory, loaded (the loaders' positions with it), else the lowest of the ranks' ``rows``
    (has state, step: their newest checkpoints), which ``load`` restores."""
    step = min(s for _, s in rows)
    restored = memory.restore(rank, step, device)
    if restored is not None:
        return restored
    for loader in loaders:
        loader.derive(step)  # load() may then restore a position of its own
    if load is not None:
        load(step)
    elif any(s != step for _, s in rows):
        raise RuntimeError(f"ranks would start at different steps {[s for _, s in rows]}: pass load= to "
                           "LiveGroup.steps() to restore the common one")
    return step


__all__ = ["LiveSnapshots", "checked_snapshot_options", "start_afresh"]
