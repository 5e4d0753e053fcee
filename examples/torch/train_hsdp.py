"""HSDP (FSDP2 over replicas x shards, gloo on CPU) that survives losing a rank without stopping the others.

An MLP learns a fixed random teacher with AdamW, ``fully_shard``-ed over a 2-D mesh made by
``live.init_device_mesh("cpu", (replicas, shards))``: each replica group holds one whole copy, cut into shards.
Under `taskd run` a dead rank alone is replaced: the survivors keep their processes and shards, the replacement
receives its shards (parameters and optimizer state) from the rank at the same shard coordinate in another
replica group, in memory, and every rank goes on from the step in flight. The batch of step s is a pure function
of (seed, rank, s), so a run with faults ends with shards bit-identical to a run without.

    taskd run --nproc-per-node 4 examples/torch/train_hsdp.py --replicas 2 --steps 40 --out /tmp/hsdp/out \\
        --kill-rank 1 --kill-at-step 17

With ``--snapshot-every K`` (``LiveGroup(snapshot_every=K)``) each rank also keeps its shards in the node's memory
every K steps: a restart of every rank (both replicas of a shard lost, a failed recover) restores the newest step
every rank holds from there (tests/e2e/worker/test_live_hsdp.py).

Under torchrun (``torchrun --standalone --nproc-per-node 4 ...``) it is an ordinary HSDP script: LiveGroup is
``init_process_group`` and ``live.init_device_mesh`` is ``init_device_mesh``; its shards end bit-identical to a
fault-free run under taskd.

Outputs per rank (the rank it was started as): OUT/rank<R>.pt (its final local shards), OUT/rank<R>.json (pid,
first step, recoveries with their timings) and OUT/rank<R>.computed (a line "step time pid" per completed step, by
every process that was rank R: its lines minus --steps are the steps redone).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
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
    p.add_argument("--replicas", type=int, default=2, help="replica groups (the mesh's first dimension)")
    p.add_argument("--kill-rank", type=int, nargs="+", default=[], help="these ranks SIGKILL themselves once, at "
                   "--kill-at-step (both replicas of a shard: no peer holds it, every rank restarts)")
    p.add_argument("--kill-at-step", type=int, default=None)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--sleep-while", default=None, metavar="FILE",
                   help="sleep --step-sleep per step only while FILE exists (a test paces the job while it acts on it)")
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--snapshot-every", type=int, default=0, help="LiveGroup(snapshot_every=K): each rank's shards "
                   "in memory every K steps, what a whole-job restart restores (0: off)")
    p.add_argument("--ckpt-dir", default=None, help="torch.distributed.checkpoint of model and optimizer here "
                   "(ckpt-dir/step<N>), resumed from its newest at start: how torchrun and job-rescheduling restart")
    p.add_argument("--ckpt-every", type=int, default=0, help="a checkpoint every K steps (0: never)")
    p.add_argument("--verbose", action="store_true", help="taskd's INFO lines (left, rejoined, handed over), timed")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """The model and the teacher it learns, the same on every rank (seeded)."""
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.Tanh()]
    return nn.Sequential(*layers[:-1]), nn.Linear(args.hidden, args.hidden)


def shard(model: nn.Module, mesh: object) -> None:
    """``fully_shard`` each Linear, then the root, over ``mesh``."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def batch(args: argparse.Namespace, teacher: nn.Module, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of (rank, step): a pure function of them and the seed."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(args.batch, args.hidden, generator=g)
    with torch.no_grad():
        return x, teacher(x)


class Checkpoints:
    """torch.distributed.checkpoint of an HSDP model and its optimizer, one directory per step: each rank writes
    its own shards (DCP keeps one copy of what replica groups share); a step's directory counts once its
    ``.metadata``, written last, is there."""

    def __init__(self, folder: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.folder, self.model, self.optimizer = folder, model, optimizer
        os.makedirs(folder, exist_ok=True)

    def _path(self, step: int) -> str:
        return os.path.join(self.folder, f"step{step:06d}")

    def steps(self) -> list[int]:
        return sorted(int(d[4:]) for d in os.listdir(self.folder)
                      if d.startswith("step") and os.path.exists(os.path.join(self.folder, d, ".metadata")))

    def newest(self) -> int:
        return (self.steps() or [0])[-1]

    def save(self, step: int) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=self._path(step))
        if worker.rank() == 0:  # the older ones are no longer needed once this one is whole
            for old in self.steps()[:-2]:
                shutil.rmtree(self._path(old), ignore_errors=True)

    def load(self, step: int) -> None:
        if step > 0:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=self._path(step))
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03d %(name)s %(message)s",
                            datefmt="%H:%M:%S")
    os.makedirs(args.out, exist_ok=True)
    model, teacher = build(args)

    live = LiveGroup(backend="gloo", timeout=args.pg_timeout, snapshot_every=args.snapshot_every)
    rank, world = worker.rank(), worker.world_size()
    if world % args.replicas:
        raise SystemExit(f"--replicas {args.replicas} does not divide the world size {world}")
    mesh = live.init_device_mesh("cpu", (args.replicas, world // args.replicas), ("replicate", "shard"))
    shard(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after fully_shard: over the DTensor parameters
    live.track(model=model, optimizer=optimizer, seed=args.seed)

    counter = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    marker = os.path.join(args.out, "killed_once" if rank == (args.kill_rank or [rank])[0] else f"killed_once.{rank}")
    first, started = None, time.time()
    ckpt = Checkpoints(args.ckpt_dir, model, optimizer) if args.ckpt_dir and args.ckpt_every else None
    for step in live.steps(ckpt.newest() if ckpt else 0, args.steps, load=ckpt.load if ckpt else None):
        first = step if first is None else first
        with live.step():
            if rank in args.kill_rank and step == args.kill_at_step and not os.path.exists(marker):
                with open(marker, "w") as fh:
                    fh.write(f"{step} {time.time():.6f}")
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(args, teacher, rank, step)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            os.write(counter, f"{step} {time.time():.6f} {os.getpid()}\n".encode())
        if ckpt is not None and live.step_no % args.ckpt_every == 0 and live.step_no > step:
            ckpt.save(live.step_no)
        if args.step_sleep and (args.sleep_while is None or os.path.exists(args.sleep_while)):
            time.sleep(args.step_sleep)
    os.close(counter)
    torch.save({k: v.to_local().clone() for k, v in model.state_dict().items()},
               os.path.join(args.out, f"rank{rank}.pt"))
    record = {"rank": rank, "pid": os.getpid(), "first_step": first, "recoveries": live.events,
              "generation": live.protocol.generation, "seconds": time.time() - started}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    live.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
