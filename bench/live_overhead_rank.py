"""One rank of bench/live_overhead.py: the same MLP and data as examples/torch/train_ddp.py, in one of
three wirings, timing every step; rank 0 writes OUT/rank0.json with the step times and the job's CPU seconds
(every process of it, ranks and launcher: bench/common.job_cpu_seconds under $BENCH_PID) after step WARMUP and
after the last step.

    plain         dist.init_process_group + DistributedDataParallel(model), DDP's default buckets
    live          LiveGroup + live.ddp (DDP's buckets, fixed at construction) + track(model, optimizer): the vote
    live-novote   the same, the optimizer handed over as an extra object: no optimizer hooks, no vote

argv: MODE OUT STEPS HIDDEN LAYERS [WARMUP]
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import job_cpu_seconds  # noqa: E402 (bench/: this script's own directory)

from taskd.worker.torch import LiveGroup  # noqa: E402

INPUTS, BATCH, SEED = 256, 32, 1234
TEARDOWN_TIMEOUT = 60.0
"""Seconds the plain rank's teardown (destroy_process_group) may take before faulthandler prints every thread's
stack to stderr (the bench shows it in the run's error) and exits 1: a hang becomes a failure that says where."""


def build(hidden: int, layers: int) -> nn.Module:
    torch.manual_seed(SEED)
    blocks: list[nn.Module] = [nn.Linear(INPUTS, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED * 1_000_003 + rank * 10_007 + step)
    return torch.randn(BATCH, INPUTS, generator=g), torch.randn(BATCH, 1, generator=g)


def train_step(ddp: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()


def main() -> int:
    mode, out, steps, hidden, layers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    warmup = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    bench = int(os.environ.get("BENCH_PID", "0"))
    model = build(hidden, layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times: list[float] = []
    cpu: list[float | None] = []

    def stepped(rank: int) -> None:
        """After every step: its time; rank 0 reads the job's CPU after step `warmup` and after the last."""
        times.append(time.perf_counter())
        if bench and rank == 0 and len(times) in (warmup + 1, steps):
            cpu.append(job_cpu_seconds(bench))

    if mode == "plain":
        dist.init_process_group("gloo")
        ddp = DistributedDataParallel(model)
        rank = dist.get_rank()
        for step in range(steps):
            train_step(ddp, optimizer, rank, step)
            stepped(rank)
        faulthandler.dump_traceback_later(TEARDOWN_TIMEOUT, exit=True)
        dist.destroy_process_group()
    else:
        live = LiveGroup(backend="gloo")
        ddp = live.ddp(model)
        if mode == "live":
            live.track(model=model, optimizer=optimizer, seed=SEED)
        else:
            live.track(model=model, seed=SEED, optimizer_state=optimizer)
        rank = live.rank
        for step in live.steps(0, steps):
            with live.step():
                train_step(ddp, optimizer, rank, step)
            stepped(rank)
        live.close()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        with open(os.path.join(out, "rank0.json"), "w") as fh:
            json.dump({"mode": mode, "times": times, "params": params, "cpu": cpu}, fh)
    if mode == "plain":
        # no interpreter teardown: a plain rank once sat in a futex wait after its results were written, gloo's two
        # worker threads still alive (the DDP reducer still held the process group), until the bench's timeout
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
