"""HSDP inside `LiveGroup`: a lost rank's shards come from its peer in another replica group (live recovery, torch).

HSDP is FSDP2's ``fully_shard`` over a 2-D DeviceMesh (replicate x shard): every replica group holds one whole
copy of the model, cut into shards, so the rank at the same shard coordinate in another replica group holds
exactly the shards (parameters, optimizer state) a dead rank held. A replacement takes them from there, point to
point, as local tensors (``DTensor.to_local()``); the survivors keep their processes and shards and nothing is
redone but the step in flight. torchft recovers HSDP too, but swaps a managed process group under the replicate
dimension and takes a whole replica group out of the quorum until it is back; here only the dead rank is
replaced, and the world size and the mesh stay as they were.

What a new generation needs besides the default group: the mesh's sub-groups, built with ``new_group`` over the
new default group's store, under the same names (``destroy_process_group`` resets the count they are named by),
and FSDP2's mesh infos, which cache their process groups. Survivors rebuild them in `Hsdp.reform`; a replacement
builds its mesh in the script through `LiveGroup.init_device_mesh`, in the same order, so the names agree.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from taskd.worker.torch_facts import sharded_state
from taskd.worker.torch_retry import ShardsLost


def _fsdp_states(model: torch.nn.Module) -> list[Any]:
    """FSDP2's state of each ``fully_shard``-ed module of ``model``."""
    return [m._get_fsdp_state() for m in model.modules() if hasattr(m, "_get_fsdp_state")]


@dataclass(frozen=True)
class Hsdp:
    """The mesh of an HSDP model: dimension 0 replicates, dimension 1 shards; what the live path needs of it."""

    mesh: DeviceMesh

    @property
    def replicas(self) -> int:
        return self.mesh.size(0)

    @property
    def shards(self) -> int:
        return self.mesh.size(1)

    def describe(self) -> str:
        return f"HSDP over a {self.replicas} x {self.shards} mesh (replicate x shard)"

    def peers(self) -> list[list[int]]:
        """For each shard coordinate, the global ranks holding those shards, one per replica group."""
        ranks = self.mesh.mesh.tolist()
        return [[row[c] for row in ranks] for c in range(self.shards)]

    def node_loss(self, per_node: int) -> str:
        """What losing one whole node (``per_node`` consecutive ranks, as `taskd run` and torchrun place them) does
        to this mesh, in words. ``init_device_mesh`` lays ranks out row by row, so a shard coordinate's replicas
        are ``shards`` ranks apart and span ``(replicas - 1) * shards + 1`` ranks, more than one node of a job of
        >= 2 nodes holds (``per_node <= replicas * shards / 2`` < that span, as ``replicas >= 2``): every mesh
        `hsdp_layout` accepts survives the loss of any one node, and only the loss of several at once can take
        every replica of a coordinate (then `sources` refuses)."""
        world = self.replicas * self.shards
        if per_node <= 0 or world % per_node:
            return f"how its ranks sit on nodes is not known (LOCAL_WORLD_SIZE {per_node})"
        if per_node == world:
            return "a lost node is the whole job (one node): every rank restarts"
        return ("a lost node's ranks are replaced live too, from the other replica groups (a standby's or a "
                "replacement's), except node 0's: its agent hosts the store, so its loss restarts every rank")

    def sources(self, rows: list[tuple[int, int]]) -> tuple[int, list[tuple[int, list[int]]]]:
        """(step, [(source, lacking ranks)]) from the state-sync table ((has state, step) per rank): at each shard
        coordinate, a rank at the newest step hands its shards to the ranks of that coordinate that lack them.
        ShardsLost when a coordinate has no rank at that step (its shards are lost: no live recovery)."""
        step = max(s for has, s in rows if has)
        pairs: list[tuple[int, list[int]]] = []
        for holders in self.peers():
            good = [r for r in holders if rows[r] == (1, step)]
            if not good:
                raise ShardsLost(f"no rank of {holders} holds its shards at step {step}: they are lost with every "
                                 "replica (every rank that held them died, or none has committed that step)")
            lacking = [r for r in holders if rows[r] != (1, step)]
            if lacking:
                pairs.append((good[0], lacking))
        return step, pairs

    def reform(self, model: torch.nn.Module | None, timeout: Any) -> None:
        """After the default group of a new generation formed: rebuild the mesh's sub-groups on it (every rank
        creates every sub-group, in the order DeviceMesh does) and point FSDP2's cached process groups at them."""
        mesh = self.mesh
        reform_groups(mesh, timeout)
        if model is None:
            return
        for info in mesh_infos(model):
            if info.mesh is not mesh and info.mesh._get_root_mesh() is not mesh:
                raise RuntimeError(f"an FSDP module's mesh {info.mesh} is not the live mesh {mesh}")
            if getattr(info, "reduce_scatter_process_group", None) is not None:
                raise RuntimeError("a separate reduce-scatter group (set_separate_reduce_scatter_group) is not "
                                   "re-formed by live recovery")
            info.__post_init__()  # re-reads mesh.get_group(dim) for the shard and replicate groups

    def groups(self) -> list[Any]:
        """The mesh's current sub-groups (held after a rank leaves them, like the default group)."""
        return [dist.distributed_c10d._resolve_process_group(n) for n in getattr(self.mesh, "_dim_group_names", [])]


def reform_groups(mesh: DeviceMesh, timeout: Any) -> None:
    """``mesh``'s sub-groups made again on the new generation's default group (every rank makes every sub-group,
    in the order DeviceMesh does: the names agree with a replacement's), with the script's timeout."""
    names = DeviceMesh._init_process_groups(mesh._layout, mesh._rank_map, mesh._mesh_dim_names,
                                            ((None, None),) * mesh.ndim)
    mesh._dim_group_names = names
    mesh._pg_registry = {name: dist.distributed_c10d._resolve_process_group(name) for name in names}
    set_timeout(mesh, timeout)


def mesh_infos(model: torch.nn.Module) -> list[Any]:
    """FSDP2's mesh infos in ``model``'s ``fully_shard``-ed modules, once each: each caches its mesh's groups."""
    infos: dict[int, Any] = {}
    for state in _fsdp_states(model):
        for group in state._fsdp_param_groups:
            for info in (group.mesh_info, group.post_forward_mesh_info, *(p.mesh_info for p in group.fsdp_params),
                         *(p.post_forward_mesh_info for p in group.fsdp_params)):
                if info is not None:
                    infos[id(info)] = info
    return list(infos.values())


def set_timeout(mesh: DeviceMesh, timeout: Any) -> None:
    """Give the mesh's sub-groups the script's collective timeout (``new_group`` gives gloo 30 minutes)."""
    for name in mesh._dim_group_names:
        dist.distributed_c10d._set_pg_timeout(timeout, dist.distributed_c10d._resolve_process_group(name))


def hsdp_layout(model: torch.nn.Module, meshes: tuple[DeviceMesh, ...]) -> Hsdp | str | None:
    """What ``model``'s sharding is to live recovery: None (no shards: whole copies, DDP's path), an `Hsdp` (a 2-D
    mesh, Replicate x Shard, >= 2 replicas, made by ``LiveGroup.init_device_mesh``), or why neither (a string):
    pure FSDP2 (no peer holds a copy of a rank's shards), one replica group, tensor parallelism, a foreign mesh."""
    why = sharded_state(model)
    meshes_of = {id(p.device_mesh): p for p in model.parameters() if isinstance(p, DTensor)}
    if why is None or len(meshes_of) != 1:
        return why if why is None or not meshes_of else f"{why}, on {len(meshes_of)} meshes"
    param = next(iter(meshes_of.values()))
    mesh, placements = param.device_mesh, tuple(param.placements)
    if mesh.ndim != 2 or not isinstance(placements[0], Replicate) or not isinstance(placements[1], Shard):
        return why  # pure FSDP2 (a 1-D mesh), or placements HSDP does not make
    if mesh.size(0) < 2:
        return f"{why} over a mesh with 1 replica group"
    if not any(mesh is m for m in meshes):
        return (f"{why} over a mesh that live.init_device_mesh() did not make (LiveGroup cannot re-form its groups "
                "after a fault)")
    return Hsdp(mesh)


def reset_step(model: torch.nn.Module | None) -> None:
    """FSDP2's state after an abandoned step (unsharded parameters, hooks mid-iteration) back to between steps:
    torch's own ``reset_iter_state`` on the root, once the broken group's work can no longer block."""
    if model is None:
        return
    for state in _fsdp_states(model):
        if state._is_root:
            for group in state._fsdp_param_groups:  # work of the broken group: its wait would raise again
                group._all_gather_result = None
            state._comm_ctx.all_gather_state = None
            state._reset_iter_state()


# -- DTensor state travels as its local shard ---------------------------------------------------------
_MARK = "__taskd_dtensor__"


def to_local(obj: Any) -> Any:
    """``obj`` (an optimizer's state_dict) with each DTensor replaced by a dict holding its local shard and what
    rebuilds it on the same mesh (`from_local`); dicts, so that `torch_state.split_tensors` sends the shard apart."""
    if isinstance(obj, DTensor):
        return {_MARK: obj.to_local(), "placements": tuple(obj.placements), "shape": tuple(obj.shape),
                "stride": tuple(obj.stride())}
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, to_local(v)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(to_local(v) for v in obj)
    return obj


def from_local(obj: Any, mesh: DeviceMesh) -> Any:
    """The inverse of `to_local`, on this rank's ``mesh`` (the same coordinate as the sender's)."""
    if isinstance(obj, dict) and _MARK in obj:
        return DTensor.from_local(obj[_MARK], mesh, obj["placements"], run_check=False, shape=torch.Size(obj["shape"]),
                                  stride=obj["stride"])
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, from_local(v, mesh)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(from_local(v, mesh) for v in obj)
    return obj


def local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's tensor as it travels: a DTensor's local shard (its storage: received into in place)."""
    return t.to_local() if isinstance(t, DTensor) else t


__all__ = ["Hsdp", "from_local", "hsdp_layout", "local", "mesh_infos", "reform_groups", "reset_step", "set_timeout",
           "to_local"]
