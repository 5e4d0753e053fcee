"""Rank 0 of a 2-rank LiveGroup DDP job ends with an allreduce still waiting, which rank 1 never joins.

Run without a launcher (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set by the test). torch 2.13's DDP keeps the
default group alive past ``destroy_process_group``; were it freed while the interpreter finalizes, rank 0's exit
would wait there for the allreduce's timeout (the first argument, seconds) joining gloo's workers.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

from taskd.worker.torch import LiveGroup


def main() -> int:
    live = LiveGroup(backend="gloo", timeout=float(sys.argv[1]))
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp = live.ddp(model)
    live.track(model=model, optimizer=optimizer)
    for _ in live.steps(0, 1):
        with live.step():
            optimizer.zero_grad()
            ddp(torch.ones(2, 8)).sum().backward()
            optimizer.step()
    if live.rank == 1:
        print("rank 1: past its last step", flush=True)
        time.sleep(3600)  # never joins rank 0's allreduce; the test kills it
    dist.all_reduce(torch.ones(1000), async_op=True)
    live.close()
    print(f"rank 0: closed at {time.time():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
