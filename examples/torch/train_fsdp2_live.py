"""Pure FSDP2 (``fully_shard`` over every rank, gloo on CPU) that survives losing a rank without stopping the others.

An MLP learns a fixed random teacher with AdamW, ``fully_shard``-ed over all ranks: no peer holds a copy of a
rank's shards. ``LiveGroup(snapshot_every=k)`` snapshots each rank's shards (parameters and optimizer state) into
its node's memory every k steps. Under `taskd run` a dead rank alone is replaced: the replacement restores its
shards from the snapshot its predecessor left in /dev/shm (or the buddy node's copy), the survivors keep their
processes and roll their own shards back in place to the same step, the newest every rank holds: at most k steps
redone. The batch of step s is a pure function of (seed, rank, s), so a run with faults ends with shards
bit-identical to a run without.

    taskd run --nproc-per-node 4 examples/torch/train_fsdp2_live.py --steps 40 --out /tmp/fsdp2/out \\
        --kill-rank 1 --kill-at-step 17

--kill-at-step S: that rank SIGKILLs itself once, after its update of step S and before its snapshot of it, so
that the other ranks go one step past its newest snapshot and roll back (one step redone, k = 1). With
--stall-ranks 2,3 those ranks instead stall there once (OUT/stalled<R> says so), so that a test can SIGKILL their
whole node at a known step, once the buddy node's agent holds their snapshots of it.

Under torchrun (``torchrun --standalone --nproc-per-node 4 ...``) it is an ordinary FSDP2 script: LiveGroup is
``init_process_group`` and the snapshots are off (no `taskd run` agent holds them); its shards end bit-identical
to a fault-free run under taskd.

Outputs per rank (the rank it was started as): OUT/rank<R>.pt (its final local shards), OUT/rank<R>.json (pid,
first step, recoveries with their timings) and OUT/rank<R>.computed (a line "step time pid" per completed step, by
every process that was rank R: its lines minus --steps are the steps redone).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

try:
    from taskd import worker
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from taskd import worker
from taskd.worker.torch import LiveGroup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--snapshot-every", type=int, default=1, help="snapshot every K steps (LiveGroup(snapshot_every))")
    p.add_argument("--kill-rank", type=int, default=None, help="this rank SIGKILLs itself once, after its update "
                   "of --kill-at-step")
    p.add_argument("--kill-at-step", type=int, default=None)
    p.add_argument("--stall-ranks", default="", help="comma-separated ranks that stall once, after their update of "
                   "--kill-at-step and before its snapshot (a test SIGKILLs their node meanwhile)")
    p.add_argument("--stall-seconds", type=float, default=120.0, help="how long a stalled rank waits at most")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--verbose", action="store_true", help="taskd's INFO lines (left, rejoined, handed over), timed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03d %(name)s %(message)s",
                            datefmt="%H:%M:%S")
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    teacher = nn.Linear(args.hidden, args.hidden)

    live = LiveGroup(backend="gloo", timeout=args.pg_timeout, snapshot_every=args.snapshot_every)
    rank = worker.rank()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after fully_shard: over the DTensor parameters
    live.track(model=model, optimizer=optimizer, seed=args.seed)

    counter = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    marker = os.path.join(args.out, "killed_once")
    stalls = rank in {int(r) for r in args.stall_ranks.split(",") if r.strip()}
    stalled = os.path.join(args.out, f"stalled{rank}")
    first, started = None, time.time()
    for step in live.steps(0, args.steps):
        first = step if first is None else first
        with live.step():
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
            x = torch.randn(args.batch, args.hidden, generator=g)
            with torch.no_grad():
                y = teacher(x)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            os.write(counter, f"{step} {time.time():.6f} {os.getpid()}\n".encode())
            if rank == args.kill_rank and step == args.kill_at_step and not os.path.exists(marker):
                with open(marker, "w") as fh:  # updated, not yet snapshotted: the others go past it and roll back
                    fh.write(f"{step} {time.time():.6f}")
                os.kill(os.getpid(), signal.SIGKILL)
            if stalls and step == args.kill_at_step and not os.path.exists(stalled):
                with open(stalled, "w") as fh:  # its snapshot of the step before is published, this one never is
                    fh.write(f"{step} {time.time():.6f} {os.getpid()}")
                time.sleep(args.stall_seconds)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    os.close(counter)
    torch.save({k: v.to_local().clone() for k, v in model.state_dict().items()},
               os.path.join(args.out, f"rank{rank}.pt"))
    record = {"rank": rank, "pid": os.getpid(), "first_step": first, "recoveries": live.events,
              "restored_from": live.memory.restored_from,
              "generation": live.protocol.generation, "seconds": time.time() - started}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    live.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
