"""What a replacement receives from the most advanced healthy rank, and how it travels (live recovery, torch).

Apart from `taskd.worker.torch`'s group mechanics: the parameters go as one flat broadcast when they share a
dtype, everything else (optimizer, ``extra`` objects such as a scheduler, each LiveLoader's data position) as
one pickled blob.
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.torch_data import LiveLoader


def broadcast_state(source: int, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                    extra: dict[str, Any], loaders: list[LiveLoader]) -> None:
    """Every rank of the group calls it; afterwards each holds ``source``'s state (collective)."""
    mine = dist.get_rank() == source
    params = [] if model is None else [t.detach() for t in model.state_dict().values()]
    if params and all(p.dtype == params[0].dtype for p in params):
        flat = torch._utils._flatten_dense_tensors(params)  # one collective for the whole model
        dist.broadcast(flat, source)
        if not mine:
            for p, new in zip(params, torch._utils._unflatten_dense_tensors(flat, params), strict=True):
                p.copy_(new)
    else:
        for p in params:
            dist.broadcast(p, source)
    blob = torch.zeros(0, dtype=torch.uint8)
    if mine:
        buf = io.BytesIO()
        torch.save({"optimizer": None if optimizer is None else optimizer.state_dict(),
                    "extra": {k: v.state_dict() for k, v in extra.items()},
                    "data": [loader.handover() for loader in loaders]}, buf)
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    size = torch.tensor([blob.numel()], dtype=torch.int64)
    dist.broadcast(size, source)
    if not mine:
        blob = torch.empty(int(size[0]), dtype=torch.uint8)
    dist.broadcast(blob, source)
    if not mine:
        state = torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=False)
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
        for key, value in state["extra"].items():
            extra[key].load_state_dict(value)
        for loader, position in zip(loaders, state["data"], strict=True):
            loader.take(position)
