"""The CPU of one snapshot save against the CPU of one training step, interleaved in one process (issue 33's k).

bench/snapshots.py pairs whole runs with and without saves; on a loaded machine their CPU per step moves by
more than a save costs. Here each sample is one step's CPU time and one `TorchSnapshots.save`'s (publish
included: ``background=False``, so the checksum and the rename are in the call), taken back to back, so the
load moves both alike; cost(k) = save / (k x step), with the 95 % interval of the per-sample ratio (not the
indirect costs a whole run also sees: the caches the copy evicts).

    PYTHONPATH=. python bench/snapshot_save_cpu.py [--samples 40] [--hidden 1024 --layers 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from common import fmt_interval, interval95  # noqa: E402
from snapshot_model import build, first_step, state_bytes, train_step  # noqa: E402

from taskd.worker.torch_snapshot import TorchSnapshots  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--ks", default="1,5,10")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    shm = tempfile.mkdtemp(prefix="taskd-bench-savecpu-", dir="/dev/shm")
    try:
        model, optimizer = build(args)
        first_step(model, optimizer, args.hidden)
        snaps = TorchSnapshots(model, optimizer, directory=shm, background=False)
        x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1))
        for step in range(1, 5):  # every segment mapped (keep 2 + 1): the saves below reuse them
            train_step(model, optimizer, x)
            snaps.save(step)
        steps, saves = [], []
        for step in range(5, 5 + args.samples):
            c = time.process_time()
            train_step(model, optimizer, x)
            steps.append(time.process_time() - c)
            c = time.process_time()
            snaps.save(step)
            saves.append(time.process_time() - c)
        print(f"state {state_bytes(model, optimizer) / 1e6:.1f} MB, {args.samples} samples, "
              f"load {os.getloadavg()[0]:.1f}")
        step_ms = interval95([s * 1e3 for s in steps])
        save_ms = interval95([s * 1e3 for s in saves])
        print(f"step CPU {fmt_interval(step_ms, 2)} ms, save CPU {fmt_interval(save_ms, 2)} ms")
        for k in (int(k) for k in args.ks.split(",")):
            cost = interval95([100.0 * sv / (k * st) for sv, st in zip(saves, steps, strict=True)])
            print(f"k={k}: save CPU / (k x step CPU) = {fmt_interval(cost)} %")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
