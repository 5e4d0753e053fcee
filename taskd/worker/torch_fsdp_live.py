"""Pure FSDP2 inside `LiveGroup`: a lost rank alone is replaced, and every rank rolls back to the newest step that
all of them hold in memory (issue 34, item 2).

``fully_shard`` over a 1-D mesh of every rank leaves no peer with a copy of a rank's shards, so a replacement
cannot receive them as an HSDP rank does from its peer replica (taskd.worker.torch_hsdp_live). With
``LiveGroup(snapshot_every=k)`` each rank snapshots its own shards (model and optimizer, the tracked objects and
loader positions with them) into its node's memory every k committed steps (`torch_live_snapshot`,
`ShardedSnapshots`); a snapshot outlives its rank (the agent holds /dev/shm and copies it to a buddy node).
After a fault the survivors keep their processes and re-form the group, and the mesh's group with it (the mesh
mechanics are HSDP's, `Hsdp.reform`: any mesh); then every rank, the replacement included, agrees over the new
group on the newest step all of them hold (the replacement's from its node's segments, which the dead rank
published, else from the copy its agent fetched from the buddy) and loads it in place: at most k steps redone,
nothing read from disk. Without such a step every rank exits cleanly after rank 0's one line (`ShardsLost`), and
the job restarts from its checkpoints.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from taskd.worker.env import Var, env_int
from taskd.worker.torch_hsdp import mesh_infos, reform_groups, reset_step
from taskd.worker.torch_retry import ShardsLost

resolve_group = dist.distributed_c10d._resolve_process_group

log = logging.getLogger(__name__)


def fsdp2_meshes(model: torch.nn.Module, world: int) -> tuple[DeviceMesh, ...]:
    """The meshes of a pure FSDP2 model, every one 1-D over all ``world`` ranks (``fully_shard`` without a mesh
    makes one per call), every parameter a DTensor sharded on dimension 0; none for anything else (HSDP, tensor
    parallel, a part of the ranks, parameters left whole)."""
    params = list(model.parameters())
    if not params or not all(isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),) for p in params):
        return ()
    meshes = {id(m): m for m in (*(p.device_mesh for p in params), *(i.mesh for i in mesh_infos(model)))}
    if any(m.ndim != 1 or m.size() != world for m in meshes.values()):
        return ()
    return tuple(meshes.values())


def node_loss(world: int, per_node: int) -> str:
    """What losing one whole node (``per_node`` of the ``world`` ranks) does to a pure FSDP2 job, in words: its
    ranks' shards are nowhere else, but their snapshots are, on the buddy node's agent (issue 33)."""
    if per_node <= 0 or world % per_node:
        return f"how its ranks sit on nodes is not known (LOCAL_WORLD_SIZE {per_node})"
    if per_node == world:
        return "a lost node is the whole job (one node): every rank restarts"
    return ("a lost node's ranks are replaced live too (a standby's or a replacement's), restoring their shards from "
            "the copy of its snapshots on its buddy node, except node 0's: its agent hosts the store, so its loss "
            "restarts every rank from the snapshots in memory")


def lost_words(newest: list[int]) -> str:
    """Why no step is common to every rank's snapshots, from each rank's newest (-1: it holds none)."""
    lacking = [r for r, s in enumerate(newest) if s < 0]
    if lacking:
        return (f"rank(s) {', '.join(map(str, lacking))} hold no snapshot in memory (neither their node's segments nor "
                "a copy fetched from the buddy node), so the shards they held are lost")
    return (f"the ranks' snapshots share no step (newest from step {min(newest)} to {max(newest)}: a copy further "
            "behind than snapshot_keep steps), so some rank's shards are lost")


class FsdpLive:
    """Mixed into `LiveGroup` (taskd.worker.torch) before `HsdpLive`: it uses the group's snapshots, sockets,
    timeout, protocol and tracked model."""

    live: bool
    rank: int
    world_size: int
    step_no: int
    timeout: Any
    protocol: Any
    memory: Any
    _sockets: Any
    _retired: Any
    _group_timeout: Any
    _model: torch.nn.Module | None
    _device: torch.device
    _fsdp: tuple[DeviceMesh, ...] = ()  # a pure FSDP2 model's meshes: its ranks roll back to a common snapshot

    def _rolls_back(self, model: torch.nn.Module, why: str) -> str | None:
        """None when ``model`` (sharded: ``why`` no peer holds a copy) takes the rollback path, pure FSDP2 with
        snapshots on, which rank 0 says in one line; else why there is no live path, with what would make one."""
        meshes = fsdp2_meshes(model, self.world_size)
        if not meshes:
            return why
        if self.memory.every <= 0:
            return f"{why} (pure FSDP2: LiveGroup(snapshot_every=k) would replace a lost rank alone, <= k steps redone)"
        self._fsdp = meshes
        if self.rank == 0:
            every = self.memory.every
            log.warning("live recovery for this job: FSDP2 over %d ranks, no peer holding a rank's shards; a lost "
                        "rank is replaced alone and restores its shards from the snapshots in memory (its node's, "
                        "else the buddy's), and every rank rolls back in place to the newest step all hold "
                        "(a snapshot every %d step%s: at most %d redone); %s", self.world_size, every,
                        "" if every == 1 else "s", every,
                        node_loss(self.world_size, env_int(Var.LOCAL_WORLD_SIZE, 0) or 0))
        return None

    def _roll_back(self) -> int:
        """Collective: every rank loads the newest step all hold in memory; the step, or ShardsLost (alike on every
        rank: the step was agreed over the group) naming the ranks that hold none."""
        held = self.step_no
        step = self.memory.roll_back()
        if step is None:
            mine = torch.tensor([self.memory.newest_held()], dtype=torch.int64, device=self._device)
            table = [torch.zeros(1, dtype=torch.int64, device=self._device) for _ in range(self.world_size)]
            dist.all_gather(table, mine)
            raise ShardsLost(lost_words([int(t[0]) for t in table]))
        log.info("rank %d: rolled back from step %d to step %d, restored from %s", self.rank, held, step,
                 self.memory.restored_from)
        return step

    def _reform_mesh(self, generation: int) -> None:
        """The FSDP2 meshes' groups on the new generation's default group (a replacement makes them in
        ``fully_shard``), and FSDP2's cached groups pointed at them."""
        super()._reform_mesh(generation)  # type: ignore[misc]
        if not self._fsdp or self._model is None:
            return
        with self._sockets.forming(generation):
            for mesh in self._fsdp:
                reform_groups(mesh, self.timeout)
        for info in mesh_infos(self._model):
            if getattr(info, "reduce_scatter_process_group", None) is not None:
                raise RuntimeError("a separate reduce-scatter group (set_separate_reduce_scatter_group) is not "
                                   "re-formed by live recovery")
            info.__post_init__()  # re-reads mesh.get_group(0)

    def _retire_mesh(self) -> None:
        """On leaving: FSDP2 back to between steps, its mesh's group held like the default group (on CPU it is the
        default group; with CUDA present a group of its own)."""
        super()._retire_mesh()  # type: ignore[misc]
        if self._fsdp:
            reset_step(self._model)
            for mesh in self._fsdp:
                for name in getattr(mesh, "_dim_group_names", []):
                    self._retired.hold(resolve_group(name), self._group_timeout.total_seconds())


__all__ = ["FsdpLive", "fsdp2_meshes", "lost_words", "node_loss"]
