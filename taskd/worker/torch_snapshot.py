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
allocated); other objects (optimizers keep what they are given) get copies of their own. See `taskd.worker.snapshot`.
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
        self.objects = objects
        self.snapshots = Snapshots(keep=keep, scope=scope, fallback=fallback, **options)
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
        found = self.snapshots.restore(use=self._load_into)
        return 0 if found is None else found[1]

    def _load_into(self, state: dict[str, Any]) -> None:
        """Load ``state`` (views of the snapshot's mapped segment) into the objects, copying each tensor once: a
        module copies into its own parameters and buffers (no allocation); anything else (an optimizer keeps
        the tensors it is given) gets its own copies first."""
        for obj, saved in zip(self.objects, state["objects"], strict=True):
            obj.load_state_dict(saved if isinstance(obj, torch.nn.Module) else copy.deepcopy(saved))
        self.extra = copy.deepcopy(state.get("extra"))

    def close(self) -> None:
        self.snapshots.close()


__all__ = ["TorchSnapshots"]
