"""Rank 0 hands its model, Adam state and an ``extra`` object's state to rank 1 (taskd.worker.torch_state).

Rank 1 then prints whether every tensor and value it holds equals rank 0's (rank 0 sends its own in the
same group afterwards, as a pickled reference; this is a test's check, not the hand-over).
"""

from __future__ import annotations

import io
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from taskd.worker.torch_state import hand_over


class Counters:
    """An ``extra`` object whose state mixes dtypes, a zero-size tensor, a shared tensor and plain values."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        shared = torch.randint(0, 1000, (7,), generator=g)
        self.state = {"ints": shared, "again": shared, "empty": torch.zeros(0, 3), "half": torch.rand(5).half(),
                      "nested": [(seed, "name", torch.rand(2, 2, generator=g))], "step": seed,
                      "big": torch.rand(1_200_000, generator=g),  # over BUCKET_BYTES: travels alone
                      "transposed": torch.rand(3, 5, generator=g).t()}  # not contiguous

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def main() -> int:
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(rank)  # the two ranks start from different weights
    model = torch.nn.Sequential(torch.nn.Linear(16, 1100), torch.nn.ReLU(), torch.nn.Linear(1100, 1000))  # a 4.4 MB one
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    if rank == 0:  # only the source has optimizer state (Adam's step is a 0-dim tensor)
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
    extra = {"counters": Counters(seed=10 + rank)}
    hand_over(0, [1], model, optimizer, extra, [])
    mine = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "extra": extra["counters"].state_dict()}
    if rank == 0:
        buf = io.BytesIO()
        torch.save(mine, buf)
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        dist.send(torch.tensor([blob.numel()]), 1)
        dist.send(blob, 1)
    else:
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, 0)
        raw = bytearray(int(size[0]))
        dist.recv(torch.frombuffer(raw, dtype=torch.uint8), 0)
        theirs = torch.load(io.BytesIO(raw), weights_only=False)
        shared = mine["extra"]["ints"] is mine["extra"]["again"]
        print(f"identical: {same(theirs, mine)}; shared tensor still shared: {shared}; "
              f"adam steps: {[float(s['step']) for s in mine['optimizer']['state'].values()]}", flush=True)
        # the received state trains on: Adam steps from it like the source would
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
