"""The model and optimizer bench/snapshots.py trains, shared with its DLRover peer (bench/dlrover_peer.py).

Imports torch only: the peer runs under a venv of its own (DLRover 0.6.1 needs torch 2.7), where taskd is absent,
and both sides must build the same state byte for byte in size.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.hidden, args.hidden), nn.Tanh())])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def first_step(model: nn.Module, optimizer: torch.optim.Optimizer, hidden: int) -> None:
    """One step, so that the optimizer holds its moments: the state a save writes and a restore brings back."""
    model(torch.randn(2, hidden)).sum().backward()
    optimizer.step()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """One measured training step, the same on both sides."""
    loss = model(x).square().mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors a save writes (call after `first_step`)."""
    tensors = list(model.state_dict().values())
    tensors += [t for s in optimizer.state_dict()["state"].values() for t in s.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def drop_cache(path: str) -> None:
    """Drop a file's pages from the page cache (after its fsync), so that a read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
