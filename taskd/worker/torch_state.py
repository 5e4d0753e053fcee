"""What a replacement receives from the most advanced healthy rank, and how it travels (live recovery, torch).

Apart from `taskd.worker.torch`'s group mechanics. Point to point, from the source to the ranks that lack
the state; the ranks that hold the same state take no part (a broadcast moved the whole state, ~72 MB for
the 9 M-parameter example, through every rank of the group, the survivors included). The parameters travel
as tensors (`buckets`: a large one alone, received in place; small ones of a dtype flattened together).
Everything else (optimizer, ``extra`` objects such as a scheduler, each LiveLoader's data position) goes as
a small pickled skeleton whose CPU tensors travel apart the same way. Pickling the example's 36 MB of
momentum buffers, copying and unpickling them made the hand-over take 0.187 s p50 between two ranks;
now 0.054 s, where the same 72 MB sent as two plain tensors take 0.03 s (`bench/hand_over.py`, BENCHMARKS.md).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.torch_data import LiveLoader
from taskd.worker.torch_hsdp import from_local, local, to_local
from taskd.worker.torch_origin import collective


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


BUCKET_BYTES = 4 << 20  # a tensor this large travels alone, smaller ones of one dtype together up to it


def buckets(tensors: list[torch.Tensor]) -> list[list[int]]:
    """The indices of ``tensors`` each message carries: alone when large (sent and received in place, no copy),
    flattened together when small (one message instead of one each). Both sides compute it alike from the
    shapes and dtypes; empty tensors take no message."""
    out: list[list[int]] = []
    filling: dict[torch.dtype, tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        size = t.numel() * t.element_size()
        if not size:
            continue
        if size >= BUCKET_BYTES:
            out.append([i])
            continue
        group, total = filling.get(t.dtype, ([], 0))
        group.append(i)
        filling[t.dtype] = (group, total + size)
        if total + size >= BUCKET_BYTES:
            out.append(group)
            del filling[t.dtype]
    out.extend(group for group, _ in filling.values())
    return out


def _messages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """What is sent, on the host: gloo's send and recv take CPU tensors only (a CUDA model's state is staged)."""
    return [(tensors[b[0]].contiguous() if len(b) == 1
             else torch._utils._flatten_dense_tensors([tensors[i] for i in b])).cpu() for b in buckets(tensors)]


def _receive(targets: list[torch.Tensor], source: int) -> None:
    """Fill ``targets`` in place with what `_messages` of the same shapes and dtypes carried."""
    for b in buckets(targets):
        if len(b) == 1 and targets[b[0]].is_contiguous() and targets[b[0]].device.type == "cpu":
            dist.recv(targets[b[0]], source)
            continue
        into = torch.empty(sum(targets[i].numel() for i in b), dtype=targets[b[0]].dtype)
        dist.recv(into, source)
        if len(b) == 1:
            targets[b[0]].copy_(into.view(targets[b[0]].shape))
            continue
        for i, view in zip(b, torch._utils._unflatten_dense_tensors(into, [targets[i] for i in b]), strict=True):
            targets[i].copy_(view)


def whole_copy(rows: list[tuple[int, int]]) -> tuple[int, list[tuple[int, list[int]]]]:
    """(step, [(source, lacking ranks)]) from the state-sync table ((has state, step) per rank), where every rank
    holds a whole copy (DDP): the most advanced holder (the lowest rank among equals) to every rank that differs."""
    source = max((r for r, (has, _) in enumerate(rows) if has), key=lambda r: (rows[r][1], -r))
    lacking = [r for r, row in enumerate(rows) if row != rows[source]]
    return rows[source][1], [(source, lacking)] if lacking else []


def hand_over(source: int, lacking: list[int], model: torch.nn.Module | None,
              optimizer: torch.optim.Optimizer | None, extra: dict[str, Any], loaders: list[LiveLoader],
              mesh: Any = None) -> None:
    """Called by ``source`` and by every rank of ``lacking``; afterwards each of them holds ``source``'s state.

    ``mesh``: HSDP's (taskd.worker.torch_hsdp): DTensor state travels as its local shards, to the rank at the same
    shard coordinate, and is rebuilt on the receiver's mesh."""
    params = [] if model is None else [local(t.detach()) for t in model.state_dict().values()]
    if dist.get_rank() == source:
        apart: list[torch.Tensor] = []
        slots: dict[int, _Slot] = {}  # in the order of `apart`: what the receiver allocates
        opt = None if optimizer is None else optimizer.state_dict()
        skeleton = split_tensors({"optimizer": opt if mesh is None else to_local(opt),
                                  "extra": {k: v.state_dict() for k, v in extra.items()},
                                  "data": [loader.handover() for loader in loaders]}, apart, slots)
        buf = io.BytesIO()
        torch.save({"skeleton": skeleton, "slots": list(slots.values())}, buf)
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        messages = [*_messages(params), torch.tensor([blob.numel()], dtype=torch.int64), blob, *_messages(apart)]
        with collective("the hand-over"):
            for dst in lacking:  # in order: each pair's messages are matched in the order they were sent
                for t in messages:
                    dist.send(t, dst)
        return
    with collective("the hand-over"):
        _receive(params, source)
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, source)
        raw = bytearray(int(size[0]))  # received in place: no numpy (torch does not need it, and a job may lack it)
        dist.recv(torch.frombuffer(raw, dtype=torch.uint8), source)
    message = torch.load(io.BytesIO(raw), weights_only=False)
    received = [torch.empty(s.shape, dtype=s.dtype) for s in message["slots"]]
    with collective("the hand-over"):
        _receive(received, source)
    state = join_tensors(message["skeleton"], received)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"] if mesh is None else from_local(state["optimizer"], mesh))
    for key, value in state["extra"].items():
        extra[key].load_state_dict(value)
    for loader, position in zip(loaders, state["data"], strict=True):
        loader.take(position)
