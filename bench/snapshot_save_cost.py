"""A snapshot save's whole CPU inside a training loop, and its page faults: blocks with and without, alternating.

bench/snapshot_save_cpu.py times the save call alone; a whole run (bench/snapshots.py) also pays what a save does
to the steps after it (the caches its copy evicts, the background publish beside the next step) and, once per
process, the first saves into fresh segments; on a loaded machine its runs move by more than that. Here each
sample is a pair of blocks run back to back in alternating order: ``--block`` training steps, once after a
`TorchSnapshots.save` (the default, background publish) and once without; each block's CPU is the process's
(``getrusage``: every thread of it, the publisher's included, which the block waits for at its end). A save's
cost is the difference, its minor page faults too (``ru_minflt``: the count, which the load does not move).
Before them, the first ``keep + 1`` saves of fresh `TorchSnapshots` (each into a new segment: a once-per-process
cost), ``--fresh`` times. Means with their 95 % interval (Student's t over the samples).

    PYTHONPATH=. python bench/snapshot_save_cost.py [--samples 60] [--block 2] [--fresh 3]
        [--hidden 1024 --layers 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from common import fmt_interval, interval95  # noqa: E402
from snapshot_model import build, first_step, state_bytes, train_step  # noqa: E402

from taskd.worker.torch_snapshot import TorchSnapshots  # noqa: E402


def usage() -> tuple[float, int]:
    """CPU seconds of the whole process (all its threads) and its minor page faults so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def fresh_saves(snaps: TorchSnapshots, model: Any, optimizer: Any, x: torch.Tensor,
                count: int) -> list[tuple[float, int]]:
    """CPU and minor faults of the first ``count`` saves of ``snaps`` (each into a segment of its own), publish
    included, one training step before each."""
    out = []
    for step in range(1, count + 1):
        train_step(model, optimizer, x)
        c, f = usage()
        snaps.save(step)
        snaps.snapshots.wait()
        c2, f2 = usage()
        out.append((c2 - c, f2 - f))
    return out


def block(snaps: TorchSnapshots, model: Any, optimizer: Any, x: torch.Tensor, steps: int,
          save_step: int | None) -> tuple[float, int, tuple[float, int]]:
    """One block: a save (unless ``save_step`` is None), ``steps`` training steps, the publish waited for; its CPU,
    minor faults, and the CPU and minor faults of the save call alone."""
    c, f = usage()
    call = (0.0, 0)
    if save_step is not None:
        snaps.save(save_step)
        c1, f1 = usage()
        call = (c1 - c, f1 - f)
    for _ in range(steps):
        train_step(model, optimizer, x)
    snaps.snapshots.wait()
    c2, f2 = usage()
    return c2 - c, f2 - f, call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=60, help="pairs of blocks (with a save, without)")
    p.add_argument("--block", type=int, default=2, help="training steps per block")
    p.add_argument("--fresh", type=int, default=3, help="fresh TorchSnapshots whose first saves are measured")
    p.add_argument("--ks", default="1,5,10")
    args = p.parse_args(argv)
    if args.samples < 2 or args.block < 1 or args.fresh < 0:
        p.error("--samples >= 2, --block >= 1, --fresh >= 0")
    torch.set_num_threads(1)
    os.environ.pop("TASKD_SNAPSHOT_DIR", None)
    model, optimizer = build(args)
    first_step(model, optimizer, args.hidden)
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1))
    first: list[tuple[float, int]] = []
    for _ in range(args.fresh):
        shm = tempfile.mkdtemp(prefix="taskd-bench-savecost-", dir="/dev/shm")
        try:
            snaps = TorchSnapshots(model, optimizer, directory=shm)
            first += fresh_saves(snaps, model, optimizer, x, snaps.snapshots.keep + 1)
            snaps.close()
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    shm = tempfile.mkdtemp(prefix="taskd-bench-savecost-", dir="/dev/shm")
    try:
        snaps = TorchSnapshots(model, optimizer, directory=shm)
        step = len(fresh_saves(snaps, model, optimizer, x, snaps.snapshots.keep + 1))  # every segment mapped
        cost, faults, calls, call_faults, per_step, ratio = [], [], [], [], [], []
        for i in range(args.samples):
            runs = {}
            for saving in ((True, False) if i % 2 == 0 else (False, True)):
                step += 1
                runs[saving] = block(snaps, model, optimizer, x, args.block, step if saving else None)
            (with_cpu, with_f, call), (without_cpu, without_f, _) = runs[True], runs[False]
            cost.append((with_cpu - without_cpu) * 1e3)
            faults.append(with_f - without_f)
            calls.append(call[0] * 1e3)
            call_faults.append(float(call[1]))
            per_step.append(without_cpu * 1e3 / args.block)
            ratio.append(cost[-1] / per_step[-1])
        snaps.close()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    print(f"state {state_bytes(model, optimizer) / 1e6:.1f} MB, {args.samples} pairs of {args.block}-step blocks, "
          f"load {os.getloadavg()[0]:.1f}")
    ms = lambda values: fmt_interval(interval95(values), 2)  # noqa: E731
    count = lambda values: fmt_interval(interval95([float(v) for v in values]), 0)  # noqa: E731
    if first:
        print(f"first saves (fresh segments, {len(first)}): CPU {ms([c * 1e3 for c, _ in first])} ms, minor faults "
              f"{count([f for _, f in first])}")
    print(f"step CPU {ms(per_step)} ms")
    print(f"save, whole (block with - block without): CPU {ms(cost)} ms, minor faults {count(faults)}")
    print(f"save, the call alone: CPU {ms(calls)} ms, minor faults {count(call_faults)}")
    for k in (int(k) for k in args.ks.split(",")):
        print(f"k={k}: whole save CPU / (k x step CPU) = {fmt_interval(interval95([100.0 * r / k for r in ratio]))} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
