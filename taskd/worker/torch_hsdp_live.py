"""LiveGroup's half of HSDP live recovery (taskd.worker.torch_hsdp has the mesh mechanics): the mesh it makes
and re-forms with each generation, the path a job takes, and the hand-over from the peer replica."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from taskd.worker.env import Var, env_int
from taskd.worker.torch_hsdp import Hsdp, hsdp_layout, reset_step, set_timeout

log = logging.getLogger(__name__)


class HsdpLive:
    """Mixed into `LiveGroup` (taskd.worker.torch): it uses the group's sockets, timeouts and tracked state."""

    live: bool
    rank: int
    timeout: Any
    protocol: Any
    _sockets: Any
    _retired: Any
    _group_timeout: Any
    _model: torch.nn.Module | None
    _meshes: tuple[DeviceMesh, ...] = ()  # made by init_device_mesh: their groups re-form with each generation
    _hsdp: Hsdp | None = None  # an HSDP model's mesh: a lost rank's shards come from a peer replica

    def init_device_mesh(self, device_type: str, mesh_shape: Sequence[int],
                         mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
        """``torch.distributed.init_device_mesh`` whose groups live recovery re-forms after a fault: the mesh of an
        HSDP model (``fully_shard(model, mesh=mesh)`` over (replicas, shards)). Call it in the same order on every
        rank, after LiveGroup(): a replacement makes it in the new generation, the survivors re-make its groups."""
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        tracked = self._sockets.forming(self.protocol.generation) if self.live else nullcontext()
        with tracked:  # live: its connections end with the default group's when the agent says it is broken
            mesh = init_device_mesh(device_type, tuple(mesh_shape), mesh_dim_names=names)
        set_timeout(mesh, self.timeout)
        self._meshes = (*self._meshes, mesh)
        return mesh

    def _path(self, model: torch.nn.Module) -> str | None:
        """Which live path ``model`` takes, said once by rank 0; why none (sharded with no copy on a peer), or None."""
        found = hsdp_layout(model, self._meshes)
        if isinstance(found, str):
            return found
        self._hsdp = found
        if found is not None and self.rank == 0:
            log.warning("live recovery for this job: %s; a lost rank is replaced alone and receives its shards "
                        "from its peer in another replica group (0 steps redone); %s", found.describe(),
                        found.node_loss(env_int(Var.LOCAL_WORLD_SIZE, 0) or 0))
        return None

    def _reform_mesh(self, generation: int) -> None:
        """The mesh's sub-groups on the new generation's default group (survivors; a replacement makes them in
        `init_device_mesh`)."""
        if self._hsdp is not None:
            with self._sockets.forming(generation):
                self._hsdp.reform(self._model, self.timeout)

    def _retire_mesh(self) -> None:
        """On leaving: FSDP2 back to between steps, the mesh's groups held like the default group (torch_group)."""
        if self._hsdp is None:
            return
        reset_step(self._model)
        for group in self._hsdp.groups():
            self._retired.hold(group, self._group_timeout.total_seconds())
