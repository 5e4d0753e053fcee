"""A plain DDP script (no LiveGroup) that loses at most k steps to a fault: in-memory snapshots every k steps.

An MLP learns a fixed random teacher with AdamW over gloo. The batch of step s is a pure function of
(seed, rank, s), so a run with faults ends with parameters bit-identical to a run without. Two lines make it
resumable from memory (marked "snapshot" below): under `taskd run` a rank's death restarts every rank
(job-rescheduling), and each restores the newest step all ranks snapshotted, from /dev/shm, without a disk.

    taskd run --nproc-per-node 4 examples/torch/train_plain.py --steps 60 --out /tmp/plain/out \\
        --kill-rank 1 --kill-at-step 25

The DDP wrapper is `taskd.worker.torch_buckets.stable_ddp` (``--torch-ddp``: torch's own): DDP re-buckets its
gradients after its first iteration, and gloo's sum with 3 or more ranks depends on where an element sits in
its bucket, so with torch's wrapper the first step after any restart (from memory or disk alike) differs from a
fault-free run in the last bits; the stable one has the re-bucketed layout from the start.

Outputs per rank: OUT/rank<R>.pt (final parameters) and OUT/rank<R>.json (steps computed including redone ones,
the step resumed from and where it came from).
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

try:
    from taskd import worker
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from taskd import worker
from taskd.worker.snapshot import DEFAULT_EVERY
from taskd.worker.torch_buckets import stable_ddp
from taskd.worker.torch_snapshot import TorchSnapshots


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt-dir", default=None, help="disk checkpoints every --ckpt-every steps: the fallback")
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--snapshot-every", type=int, default=DEFAULT_EVERY,
                   help=f"snapshot every K steps (0: never; default {DEFAULT_EVERY}: within 3 %% of a step's CPU)")
    p.add_argument("--snapshot-keep", type=int, default=2, help="snapshots kept per rank (on several nodes: more "
                   "than the steps a buddy's copy lags, so that the ranks still share a step with it)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--sleep-while", default=None, metavar="FILE",
                   help="sleep --step-sleep per step only while FILE exists (a test paces the job while it acts on it)")
    p.add_argument("--restart-gate", default=None, metavar="FILE",
                   help="after a restart, create FILE.waiting<RANK> and wait (up to 120 s) for FILE before restoring "
                   "(a test damages a snapshot meanwhile)")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself once, after --kill-at-step")
    p.add_argument("--kill-at-step", type=int, default=None)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--torch-ddp", action="store_true", help="torch's DDP wrapper (see above), not the stable one")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(args.seed)
    dims = [args.hidden] * (args.layers + 1)
    layers: list[nn.Module] = []
    for a, b in zip(dims, dims[1:], strict=False):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    teacher = nn.Linear(args.hidden, args.hidden)
    return model, teacher


def wait_for_gate(gate: str, rank: int, timeout: float = 120.0) -> None:
    with open(f"{gate}.waiting{rank}", "w"):
        pass
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: {gate} did not appear within {timeout} s")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = worker.rank()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("gloo")
    model, teacher = build(args)
    ddp = nn.parallel.DistributedDataParallel(model) if args.torch_ddp else stable_ddp(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = worker.CheckpointManager(os.path.join(args.ckpt_dir, f"rank{rank}")) if args.ckpt_dir else None

    snapshots = TorchSnapshots(model, optimizer, keep=args.snapshot_keep, fallback=ckpt)  # snapshot: what to keep
    if args.restart_gate and worker.restart_count() > 0:
        wait_for_gate(args.restart_gate, rank)
    start = snapshots.restore()  # snapshot: state in (the newest step every rank holds in memory, else disk, else 0)
    steps = torch.tensor([start])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    if int(steps) != start:  # disk checkpoints need not agree (a rank killed while saving): take the common one
        raise SystemExit(f"rank {rank}: restored step {start}, another rank step {int(steps)}: not one cut")

    counter_path = os.path.join(args.out, f"rank{rank}.computed")
    counter = os.open(counter_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    marker = os.path.join(args.out, "killed_once")
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
        x = torch.randn(args.batch, args.hidden, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        os.write(counter, b".")
        if args.snapshot_every and (step + 1) % args.snapshot_every == 0:
            snapshots.save(step + 1)  # state out: one memory copy, published in the background
        if ckpt is not None and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
            ckpt.save(snapshots.state(), step + 1)
        worker.heartbeat(step + 1)
        if args.step_sleep > 0 and (args.sleep_while is None or os.path.exists(args.sleep_while)):
            time.sleep(args.step_sleep)
        if rank == args.kill_rank and step + 1 == args.kill_at_step and not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(step + 1))
            os.kill(os.getpid(), signal.SIGKILL)
    snapshots.close()
    os.close(counter)
    torch.save(model.state_dict(), os.path.join(args.out, f"rank{rank}.pt"))
    summary = {"rank": rank, "computed": os.path.getsize(counter_path), "resumed_from": start,
               "restored_from": snapshots.restored_from, "restart_count": worker.restart_count()}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(summary, fh)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
