"""Snapshots of a plain PyTorch script: two lines, the state in at the start and out after each step.

    from taskd.worker.torch_snapshot import TorchSnapshots

    snapshots = TorchSnapshots(model, optimizer)      # anything with state_dict() / load_state_dict()
    start = snapshots.restore()                       # state in: the newest consistent step, 0 if none
    for step in range(start, steps):
        train_step(step)
        snapshots.save(step + 1)                      # state out: one memory copy of model and optimizer

Tensors go into the snapshot as raw bytes (any dtype, bfloat16 included), out of band: a CPU tensor is copied
once, straight into the shared-memory segment; a GPU tensor is first copied to the host. On restore a module's
``load_state_dict`` copies them straight from the mapped segment into its parameters (one copy, nothing
allocated), an optimizer's into the state tensors it holds (allocated only where it has none yet: a fresh
process's); other objects (they keep what they are given) get copies of their own. See `taskd.worker.snapshot`.

FSDP2 (``fully_shard``) and other DTensor state: `ShardedSnapshots(model, optimizer)`, same two lines. Each rank
snapshots its own shards, what ``torch.distributed.checkpoint``'s ``get_model_state_dict`` and
``get_optimizer_state_dict`` give (a DTensor goes in as its local shard, its placements and global shape), and
restores them into DTensors on the mesh of the model it is handed (``set_*_state_dict``): nothing is gathered.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import torch

from taskd.worker.snapshot import Fallback, Snapshots
from taskd.worker.snapshot_segment import SnapshotError, register_reducer


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def _reduce_tensor(tensor: torch.Tensor) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise SnapshotError(f"a {tensor.layout} tensor{' (quantized)' if tensor.is_quantized else ''} cannot be "
                            "snapshotted: only dense (strided) tensors")
    flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    data = flat.contiguous().view(torch.uint8).numpy()  # a view of its memory: copied once, into the segment
    return _rebuild_tensor, (data, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def _rebuild_tensor(data: Any, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)


register_reducer(torch.Tensor, _reduce_tensor)


def optimizer_state(optimizer: torch.optim.Optimizer, saved: Any) -> Any:
    """``saved`` (an optimizer's state dict whose tensors are views of a snapshot) made the optimizer's own, for its
    ``load_state_dict``: each tensor copied into the one the optimizer already holds under the same parameter and
    key (same shape and dtype: nothing allocated or re-created, and a GPU optimizer's state filled by one copy
    from the host), the others into copies of their own. In place only when the groups have the sizes
    ``load_state_dict`` checks, so that a state it refuses changes nothing."""
    if not _same_groups(optimizer, saved):
        return copy.deepcopy(saved)
    held = optimizer.state_dict()["state"]  # the optimizer's own tensors, not copies
    out = {key: copy.deepcopy(value) for key, value in saved.items() if key != "state"}
    out["state"] = {}
    for index, entry in saved["state"].items():
        mine = held.get(index)
        if isinstance(entry, dict) and isinstance(mine, dict):
            out["state"][index] = {key: _copied_into(mine.get(key), value) for key, value in entry.items()}
        else:
            out["state"][index] = copy.deepcopy(entry)
    return out


def _same_groups(optimizer: torch.optim.Optimizer, saved: Any) -> bool:
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not isinstance(saved.get("state"), dict) \
            or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return False
    return [len(g["params"]) for g in groups] == [len(g["params"]) for g in optimizer.param_groups]


def _copied_into(held: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor) and isinstance(held, torch.Tensor) and held is not value \
            and held.shape == value.shape and held.dtype == value.dtype and not held.requires_grad:
        with torch.no_grad():
            held.copy_(value)
        return held
    return copy.deepcopy(value)


def is_sharded(obj: Any) -> bool:
    """Whether ``obj`` is a module with DTensor parameters (FSDP2, HSDP, tensor parallel): `ShardedSnapshots`'."""
    return isinstance(obj, torch.nn.Module) and any(type(p).__name__ == "DTensor" for p in obj.parameters())


def common_steps(steps: set[int]) -> set[int]:
    """The steps every rank of the job holds, from each rank's own: the cut across nodes (`Snapshots`'s ``agree``).
    A collective of the default group, which every rank's ``restore`` calls; SnapshotError before
    ``init_process_group``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise SnapshotError("the job runs on several nodes and torch.distributed is not initialized: call "
                            "init_process_group before restore, so that the ranks agree on one step")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(steps))
    return set.intersection(*(set(g) for g in gathered))


class TorchSnapshots:
    """The snapshots of ``objects`` (modules, optimizers, LR schedulers: whatever has ``state_dict``) under
    one step. ``keep``, ``scope``, ``fallback`` as `taskd.worker.Snapshots`; the fallback here is a
    `CheckpointManager` whose checkpoints hold the same list of state dicts (what ``save_to`` writes)."""

    def __init__(self, *objects: Stateful, keep: int = 2, scope: str = "job", fallback: Fallback | None = None,
                 **options: Any) -> None:
        if not objects:
            raise ValueError("TorchSnapshots needs the objects to snapshot (model, optimizer, ...)")
        for obj in objects:
            if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
                raise TypeError(f"{type(obj).__name__} has no state_dict()/load_state_dict()")
            if is_sharded(obj):
                raise TypeError(f"{type(obj).__name__} holds DTensor shards (FSDP2, tensor parallel): snapshot it "
                                "with ShardedSnapshots(model, optimizer)")
        self.objects = objects
        self.snapshots = Snapshots(keep=keep, scope=scope, fallback=fallback, **{"agree": common_steps, **options})
        self.extra: Any = None  # what the restored snapshot carried besides the objects (save's ``extra``)

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def state(self, extra: Any = None) -> dict[str, Any]:
        """What a snapshot (or a disk checkpoint, for the fallback) of the objects holds."""
        return {"objects": [obj.state_dict() for obj in self.objects], "extra": extra}

    def save(self, step: int, extra: Any = None) -> bool:
        """Snapshot the objects' state (and ``extra``, small and picklable) as ``step``; False when off."""
        return self.snapshots.save(self.state(extra), step)

    def restore(self) -> int:
        """Load the newest consistent snapshot (or the fallback's checkpoint) into the objects; the step to
        start from, 0 when there is none."""
        found = self.snapshots.restore(use=self.load_into)
        return 0 if found is None else found[1]

    def load_into(self, state: dict[str, Any]) -> None:
        """Load ``state`` (views of the snapshot's mapped segment) into the objects, copying each tensor once: a
        module copies into its own parameters and buffers (no allocation), an optimizer into the state tensors it
        already holds (`optimizer_state`); anything else (it keeps the tensors it is given) gets its own copies."""
        for obj, saved in zip(self.objects, state["objects"], strict=True):
            if isinstance(obj, torch.nn.Module):
                obj.load_state_dict(saved)
            elif isinstance(obj, torch.optim.Optimizer):
                obj.load_state_dict(optimizer_state(obj, saved))
            else:
                obj.load_state_dict(copy.deepcopy(saved))
        self.extra = copy.deepcopy(state.get("extra"))

    def close(self) -> None:
        self.snapshots.close()


class _Shard:
    """A DTensor in a snapshot: this rank's local shard, and where it sits in the whole (checked on restore)."""

    def __init__(self, local: torch.Tensor, placements: tuple[Any, ...], shape: tuple[int, ...]) -> None:
        self.local, self.placements, self.shape = local, placements, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return _Shard, (self.local, self.placements, self.shape)


def _reduce_dtensor(tensor: Any) -> tuple[Any, ...]:
    return _Shard, (tensor.to_local(), tuple(tensor.placements), tuple(tensor.shape))


def _rebuild(saved: Any, template: Any, own: bool, where: str) -> Any:
    """``saved`` with each `_Shard` a DTensor again, on the mesh and placements of the same entry of ``template``
    (the live model's or optimizer's state dict); ``own``: copies of the snapshot's memory (an optimizer keeps
    what it is given), else views of it (a model copies them into its parameters)."""
    from torch.distributed.tensor import DTensor

    if isinstance(saved, _Shard):
        if not isinstance(template, DTensor) or tuple(template.placements) != saved.placements \
                or tuple(template.shape) != saved.shape:
            now = (f"{list(template.placements)} of shape {tuple(template.shape)}" if isinstance(template, DTensor)
                   else type(template).__name__)
            raise SnapshotError(f"{where}: the snapshot holds a shard {list(saved.placements)} of shape "
                                f"{saved.shape}, the model now {now}: not the model (or mesh) it was taken from")
        local = saved.local.clone() if own else saved.local
        return DTensor.from_local(local, template.device_mesh, template.placements, shape=template.shape,
                                  stride=template.stride())
    if isinstance(saved, dict):
        return {k: _rebuild(v, template.get(k) if isinstance(template, dict) else None, own, f"{where}.{k}")
                for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        same = isinstance(template, (list, tuple)) and len(template) == len(saved)
        return type(saved)(_rebuild(v, template[i] if same else None, own, f"{where}[{i}]")
                           for i, v in enumerate(saved))
    return copy.deepcopy(saved) if own else saved


class ShardedSnapshots:
    """The snapshots of a sharded model (FSDP2's ``fully_shard``, DTensor parameters) and its optimizer: each rank
    its own shards, through ``torch.distributed.checkpoint.state_dict``. ``keep``, ``fallback`` and the options
    as `TorchSnapshots` (scope "job": the ranks of a sharded model always restore one step together)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, keep: int = 2,
                 fallback: Fallback | None = None, **options: Any) -> None:
        from torch.distributed.tensor import DTensor

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ShardedSnapshots needs the model (a torch.nn.Module), not {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        register_reducer(DTensor, _reduce_dtensor)  # before torch.Tensor's: a DTensor's own type comes first
        self.model, self.optimizer = model, optimizer
        self.snapshots = Snapshots(keep=keep, scope="job", fallback=fallback, **{"agree": common_steps, **options})
        self.extra: Any = None

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def state(self, extra: Any = None) -> dict[str, Any]:
        """This rank's shards of the model's and the optimizer's state (DTensors), keyed by parameter name."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        optim = get_optimizer_state_dict(self.model, self.optimizer) if self.optimizer is not None else None
        return {"model": get_model_state_dict(self.model), "optimizer": optim, "extra": extra}

    def save(self, step: int, extra: Any = None) -> bool:
        """Snapshot this rank's shards (and ``extra``, small and picklable) as ``step``; False when off."""
        return self.snapshots.save(self.state(extra), step)

    def restore(self, agreed: bool = False) -> int:
        """Load the newest step every rank holds (or the fallback's checkpoint) into the model and optimizer; the
        step to start from, 0 when there is none. ``agreed``: as `Snapshots.restore` (a running group rolls back)."""
        found = self.snapshots.restore(use=self._load_into, agreed=agreed)
        return 0 if found is None else found[1]

    def _load_into(self, saved: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        now = self.state()  # the live DTensors (and an optimizer's state, initialised): the mesh to rebuild on
        set_model_state_dict(self.model, _rebuild(saved["model"], now["model"], False, "model"))
        if self.optimizer is not None:
            set_optimizer_state_dict(self.model, self.optimizer,
                                     _rebuild(saved["optimizer"], now["optimizer"], True, "optimizer"))
        self.extra = copy.deepcopy(saved.get("extra"))

    def close(self) -> None:
        self.snapshots.close()


__all__ = ["ShardedSnapshots", "TorchSnapshots", "common_steps", "is_sharded", "optimizer_state"]
