"""An FSDP2 (``fully_shard``) script that loses at most k steps to a fault: each rank snapshots its own shards.

An MLP, sharded over every rank by ``fully_shard`` (gloo, CPU), learns a fixed random teacher with AdamW. The
batch of step s is a pure function of (seed, rank, s), so a run with faults ends with shards bit-identical to
a run without. Two lines make it resumable from memory (marked "snapshot"): a sharded job is not live, so under
`taskd run` a rank's death restarts every rank (job-rescheduling), and each restores its own shards of model and
optimizer from the newest step all ranks snapshotted, from /dev/shm: nothing is gathered, nothing read from disk.

    taskd run --nproc-per-node 4 examples/torch/train_fsdp2.py --steps 40 --out /tmp/fsdp2/out \\
        --kill-rank 1 --kill-at-step 17

Outputs per rank: OUT/rank<R>.pt (its final shards) and OUT/rank<R>.json (steps computed including redone ones,
the step resumed from and where it came from, the restore's time, a save's and a step's, the save included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

try:
    from taskd import worker
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from taskd import worker
from taskd.worker.snapshot import DEFAULT_EVERY
from taskd.worker.torch_snapshot import ShardedSnapshots


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--snapshot-every", type=int, default=DEFAULT_EVERY,
                   help=f"snapshot every K steps (0: never; default {DEFAULT_EVERY}: within 3 %% of a step's CPU)")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself once, after --kill-at-step")
    p.add_argument("--kill-at-step", type=int, default=None)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    teacher = nn.Linear(args.hidden, args.hidden)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, teacher


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = worker.rank()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("gloo")
    model, teacher = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    snapshots = ShardedSnapshots(model, optimizer)  # snapshot: this rank's shards of model and optimizer
    started = time.perf_counter()
    start = snapshots.restore()  # snapshot: state in (the newest step every rank holds in memory, else 0)
    restore_s = time.perf_counter() - started
    steps = torch.tensor([start])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    if int(steps) != start:
        raise SystemExit(f"rank {rank}: restored step {start}, another rank step {int(steps)}: not one cut")

    counter_path = os.path.join(args.out, f"rank{rank}.computed")
    counter = os.open(counter_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    marker = os.path.join(args.out, "killed_once")
    saving, looping = 0.0, time.perf_counter()
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
        x = torch.randn(args.batch, args.hidden, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        os.write(counter, b".")
        if args.snapshot_every and (step + 1) % args.snapshot_every == 0:
            began = time.perf_counter()
            snapshots.save(step + 1)  # state out: one memory copy of this rank's shards
            saving += time.perf_counter() - began
        worker.heartbeat(step + 1)
        if rank == args.kill_rank and step + 1 == args.kill_at_step and not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(step + 1))
            os.kill(os.getpid(), signal.SIGKILL)
    looping = time.perf_counter() - looping
    snapshots.close()
    os.close(counter)
    shards = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    torch.save(shards, os.path.join(args.out, f"rank{rank}.pt"))
    summary = {"rank": rank, "computed": os.path.getsize(counter_path), "resumed_from": start,
               "restored_from": snapshots.restored_from, "restart_count": worker.restart_count(),
               "restore_s": round(restore_s, 4), "save_s_per_step": round(saving / max(1, args.steps - start), 5),
               "step_s": round(looping / max(1, args.steps - start), 5)}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(summary, fh)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
