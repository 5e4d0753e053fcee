"""What a replacement receives from the most advanced healthy rank, and how it travels (live recovery, torch).

Apart from `taskd.worker.torch`'s group mechanics. Point to point, from the source to the ranks that lack
the state; the ranks that hold the same state take no part (a broadcast moved the whole state, ~72 MB for
the 9 M-parameter example, through every rank of the group, the survivors included). The parameters go as
one flat tensor when they share a dtype. Everything else (optimizer, ``extra`` objects such as a scheduler,
each LiveLoader's data position) goes as a small pickled skeleton whose CPU tensors travel apart, one flat
tensor per dtype: pickling the example's 36 MB of momentum buffers, copying and unpickling them made the
hand-over take 0.21 s between two ranks, where sending 72 MB as two tensors takes 0.04 s.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.torch_data import LiveLoader


class LiveUsageError(RuntimeError):
    """The script does something that would break a replacement's join: refused at job start, with what to do."""


def refuse_own_collectives(rank: int, issued: int) -> None:
    """Before the hand-over: a collective the script ran since the group formed would, on a replacement, meet
    the survivors' hand-over instead of its peers' own collective (the survivors time out, the join breaks)."""
    if issued:
        raise LiveUsageError(
            f"rank {rank}: {issued} collective(s) of the script's own ran between LiveGroup() and live.steps() (e.g. "
            "an all_reduce to find the newest common checkpoint step). A replacement would run them against survivors "
            "that are handing it their state, and its join would break. Remove them: pass each rank's own newest step "
            "to live.steps(start, ...), which agrees on the lowest one and calls load(step) with it "
            "(docs/pytorch.md, 'What the script must not do')")


@dataclass(frozen=True)
class _Slot:
    """Where a tensor that travels apart sat in the skeleton: its index, shape and dtype."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _travels_apart(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided \
        and not value.requires_grad


def split_tensors(obj: Any, tensors: list[torch.Tensor], seen: dict[int, _Slot] | None = None) -> Any:
    """``obj`` with each CPU tensor in its dicts, lists and tuples replaced by a `_Slot`; the tensors in ``tensors``.

    A tensor that appears twice gets one slot, so it is one tensor again on the other side. Other containers
    are pickled whole, their tensors with them.
    """
    seen = {} if seen is None else seen
    if _travels_apart(obj):
        slot = seen.get(id(obj))
        if slot is None:
            slot = seen[id(obj)] = _Slot(len(tensors), tuple(obj.shape), obj.dtype)
            tensors.append(obj)
        return slot
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, split_tensors(v, tensors, seen)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(split_tensors(v, tensors, seen) for v in obj)
    return obj


def join_tensors(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of `split_tensors`: every `_Slot` replaced by its tensor."""
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, join_tensors(v, tensors)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(join_tensors(v, tensors) for v in obj)
    return obj


def _by_dtype(slots: list[_Slot]) -> dict[torch.dtype, list[_Slot]]:
    """The slots of each dtype that has elements to send, in a fixed order both sides compute alike."""
    groups: dict[torch.dtype, list[_Slot]] = {}
    for slot in slots:
        if torch.Size(slot.shape).numel():
            groups.setdefault(slot.dtype, []).append(slot)
    return groups


def hand_over(source: int, lacking: list[int], model: torch.nn.Module | None,
              optimizer: torch.optim.Optimizer | None, extra: dict[str, Any], loaders: list[LiveLoader]) -> None:
    """Called by ``source`` and by every rank of ``lacking``; afterwards each of them holds ``source``'s state."""
    params = [] if model is None else [t.detach() for t in model.state_dict().values()]
    one_dtype = bool(params) and all(p.dtype == params[0].dtype for p in params)
    sending = dist.get_rank() == source
    flat = None if not one_dtype else torch._utils._flatten_dense_tensors(params) if sending \
        else torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype)  # to receive into
    tensors = [flat] if flat is not None else params
    if sending:
        apart: list[torch.Tensor] = []
        skeleton = split_tensors({"optimizer": None if optimizer is None else optimizer.state_dict(),
                                  "extra": {k: v.state_dict() for k, v in extra.items()},
                                  "data": [loader.handover() for loader in loaders]}, apart)
        slots = [_Slot(i, tuple(t.shape), t.dtype) for i, t in enumerate(apart)]
        buf = io.BytesIO()
        torch.save({"skeleton": skeleton, "slots": slots}, buf)
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.int64)
        flats = [torch._utils._flatten_dense_tensors([apart[s.index] for s in group])
                 for group in _by_dtype(slots).values()]
        for dst in lacking:  # in order: each pair's messages are matched in the order they were sent
            for t in (*tensors, size, blob, *flats):
                dist.send(t, dst)
        return
    for t in tensors:
        dist.recv(t, source)
    if flat is not None:
        for p, new in zip(params, torch._utils._unflatten_dense_tensors(flat, params), strict=True):
            p.copy_(new)
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, source)
    blob = torch.empty(int(size[0]), dtype=torch.uint8)
    dist.recv(blob, source)
    message = torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=False)
    slots: list[_Slot] = message["slots"]
    received = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    for dtype, group in _by_dtype(slots).items():
        into = torch.empty(sum(torch.Size(s.shape).numel() for s in group), dtype=dtype)
        dist.recv(into, source)
        for s, view in zip(group, torch._utils._unflatten_dense_tensors(into, [received[s.index] for s in group]),
                           strict=True):
            received[s.index] = view
    state = join_tensors(message["skeleton"], received)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    for key, value in state["extra"].items():
        extra[key].load_state_dict(value)
    for loader, position in zip(loaders, state["data"], strict=True):
        loader.take(position)
