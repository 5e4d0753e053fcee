"""What a replacement receives from the most advanced healthy rank, and how it travels (live recovery, torch).

Apart from `taskd.worker.torch`'s group mechanics. Point to point, from the source to the ranks that lack
the state; the ranks that hold the same state take no part (a broadcast moved the whole state, ~72 MB for
the 9 M-parameter example, through every rank of the group, the survivors included). The parameters go as
one flat tensor when they share a dtype; everything else (optimizer, ``extra`` objects such as a scheduler,
each LiveLoader's data position) as one pickled blob.
"""

from __future__ import annotations

import io
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


def hand_over(source: int, lacking: list[int], model: torch.nn.Module | None,
              optimizer: torch.optim.Optimizer | None, extra: dict[str, Any], loaders: list[LiveLoader]) -> None:
    """Called by ``source`` and by every rank of ``lacking``; afterwards each of them holds ``source``'s state."""
    params = [] if model is None else [t.detach() for t in model.state_dict().values()]
    flat = torch._utils._flatten_dense_tensors(params) \
        if params and all(p.dtype == params[0].dtype for p in params) else None
    tensors = [flat] if flat is not None else params
    if dist.get_rank() == source:
        buf = io.BytesIO()
        torch.save({"optimizer": None if optimizer is None else optimizer.state_dict(),
                    "extra": {k: v.state_dict() for k, v in extra.items()},
                    "data": [loader.handover() for loader in loaders]}, buf)
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.int64)
        for dst in lacking:  # in order: each pair's messages are matched in the order they were sent
            for t in (*tensors, size, blob):
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
    state = torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=False)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    for key, value in state["extra"].items():
        extra[key].load_state_dict(value)
    for loader, position in zip(loaders, state["data"], strict=True):
        loader.take(position)
