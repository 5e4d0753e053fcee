"""A plain DDP script as a torchrun user writes it (gloo, env://): the tests launch it with torchrun and taskd run.

    ddp_train.py OUT [--steps N] [--crash-once]

Each rank trains a few steps on data that is a function of (rank, step) and prints one line per
step; rank 0 writes the final weights to OUT/final.pt. With --crash-once, rank 1 exits 3 before
joining the group the first time (OUT/crashed marks it), so that a launcher must restart it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--crash-once", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    os.makedirs(args.out, exist_ok=True)
    marker = os.path.join(args.out, "crashed")
    if args.crash_once and rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        print("rank 1: crashing once, as asked", file=sys.stderr, flush=True)
        sys.exit(3)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank}: step {step + 1} loss {loss.item():.6f}", flush=True)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
    print(f"rank {rank}: done", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13's destroy_process_group() leaves gloo's worker threads running; one of them may free the
    # barrier's work while the interpreter finalizes and abort this rank (SIGABRT, "terminate called without
    # an active exception"), a failed rank under either launcher: docs/pytorch.md, "Ending a DDP script".
    # Nothing is left to finalize here, so leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
