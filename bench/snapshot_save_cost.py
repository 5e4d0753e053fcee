"""A snapshot save's whole CPU inside a training loop, and its page faults: blocks with and without, alternating.

bench/snapshot_save_cpu.py times the save call alone; a whole run (bench/snapshots.py) also pays what a save does
to the steps after it (the caches its copy evicts, the background publish beside the next step) and, once per
process, the first saves into fresh segments; on a loaded machine its runs move by more than that. Here each
sample is a pair of blocks run back to back in alternating order: ``--block`` training steps, once after a
`TorchSnapshots.save` (the default, background publish, waited for) and once without; each block's CPU is the
process's (``getrusage``: every thread of it, the publisher's included). A save's whole cost is the difference
(what it does to the steps after it included; as noisy as the steps), its minor page faults too (``ru_minflt``:
a count, which the load does not move, though the steps' own allocations do); the save alone (the call and its
publish, before the steps) is measured too, precisely.
This is the paired method bench/live_overhead.py uses for LiveGroup's steady-state cost (blocks with and without
the work, alternating in the same process, each pair's difference taken): a snapshot's steady-state cost is
measured here, not by bench/snapshots.py's whole runs, whose rounds drift by more than the cost.
Before them, the first ``keep + 1`` saves of fresh `TorchSnapshots` (each into a new segment: a once-per-process
cost), ``--fresh`` times. Means with their 95 % interval (Student's t over the samples).

With ``--second-pass PAIRS``: a save (call and publish) with the CRC taken behind the copy, as `write_body` does,
against the same with the CRC as a second pass over the body on the publishing thread (as before), alternating in
one process, paired.

    PYTHONPATH=. python bench/snapshot_save_cost.py [--samples 60] [--block 2] [--fresh 3] [--second-pass 80]
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

from taskd.worker import snapshot as snapshot_module  # noqa: E402
from taskd.worker import snapshot_segment as segment  # noqa: E402
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
    """One block: a save (unless ``save_step`` is None) and its publish, then ``steps`` training steps; the block's
    CPU and minor faults, and those of the save (the call and its publish, waited for before the steps)."""
    c, f = usage()
    saved = (0.0, 0)
    if save_step is not None:
        snaps.save(save_step)
        snaps.snapshots.wait()
        c1, f1 = usage()
        saved = (c1 - c, f1 - f)
    for _ in range(steps):
        train_step(model, optimizer, x)
    c2, f2 = usage()
    return c2 - c, f2 - f, saved


def _copy_only(target: memoryview, flat: segment.Flat, between: Any = None) -> tuple[int, int]:
    """The copy without its CRC (what `write_body` did before the CRC moved behind the copy)."""
    offsets, length = flat.layout
    body = target[segment.HEADER_SIZE:segment.HEADER_SIZE + length]
    table = b"".join(segment._ENTRY.pack(o, b.nbytes) for o, b in zip(offsets, flat.buffers, strict=True))
    body[:len(table)] = table
    body[len(table):len(table) + len(flat.skeleton)] = flat.skeleton
    for offset, buf in zip(offsets, flat.buffers, strict=True):
        body[offset:offset + buf.nbytes] = buf
    body.release()
    return length, -1


def _seal_second_pass(target: memoryview, step: int, rank: int, world: int, length: int, skeleton: int,
                      count: int, crc: int) -> None:
    """The CRC as a second pass over the whole body, on the publishing thread (before)."""
    body = target[segment.HEADER_SIZE:segment.HEADER_SIZE + length]
    crc = segment.crc32(body)
    body.release()
    segment.seal(target, step, rank, world, length, skeleton, count, crc)


def second_pass(snaps: TorchSnapshots, model: Any, optimizer: Any, x: torch.Tensor, pairs: int,
                step: int) -> dict[str, list[float]]:
    """A save's CPU (call and publish) with the CRC behind the copy and with it as a second pass on the
    publishing thread, alternating in this process, one training step before each."""
    out: dict[str, list[float]] = {"behind the copy": [], "second pass": []}
    ways = {"behind the copy": (segment.write_body, segment.seal), "second pass": (_copy_only, _seal_second_pass)}
    try:
        for i in range(pairs):
            for way in list(ways) if i % 2 == 0 else list(ways)[::-1]:
                snapshot_module.write_body, snapshot_module.seal = ways[way]
                train_step(model, optimizer, x)
                c, _ = usage()
                step += 1
                snaps.save(step)
                snaps.snapshots.wait()
                out[way].append((usage()[0] - c) * 1e3)
    finally:
        snapshot_module.write_body, snapshot_module.seal = segment.write_body, segment.seal
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=60, help="pairs of blocks (with a save, without)")
    p.add_argument("--block", type=int, default=2, help="training steps per block")
    p.add_argument("--fresh", type=int, default=3, help="fresh TorchSnapshots whose first saves are measured")
    p.add_argument("--ks", default="1,5,10")
    p.add_argument("--second-pass", type=int, default=0, metavar="PAIRS",
                   help="also this many pairs of saves: the CRC behind the copy against a second pass on the thread")
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
        ways = second_pass(snaps, model, optimizer, x, args.second_pass, step) if args.second_pass else {}
        snaps.close()
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    print(f"state {state_bytes(model, optimizer) / 1e6:.1f} MB, {args.samples} pairs of {args.block}-step blocks, "
          f"load {os.getloadavg()[0]:.1f}; paired in this process (with a save, without; alternating), CPU of every "
          "thread (getrusage), mean ± 95 % interval")
    ms = lambda values: fmt_interval(interval95(values), 2)  # noqa: E731
    count = lambda values: fmt_interval(interval95([float(v) for v in values]), 0)  # noqa: E731
    if first:
        print(f"first saves (fresh segments, {len(first)}): CPU {ms([c * 1e3 for c, _ in first])} ms, minor faults "
              f"{count([f for _, f in first])}")
    print(f"step CPU {ms(per_step)} ms")
    print(f"save, whole (block with - block without): CPU {ms(cost)} ms, minor faults {count(faults)}")
    print(f"save, alone (the call and its publish): CPU {ms(calls)} ms, minor faults {count(call_faults)}")
    if ways:
        diff = [a - b for a, b in zip(ways["second pass"], ways["behind the copy"], strict=True)]
        print(f"save (call and publish), CRC behind the copy: {ms(ways['behind the copy'])} ms; as a second pass: "
              f"{ms(ways['second pass'])} ms; paired difference {ms(diff)} ms ({args.second_pass} pairs)")
    for k in (int(k) for k in args.ks.split(",")):
        print(f"k={k}: whole save CPU / (k x step CPU) = {fmt_interval(interval95([100.0 * r / k for r in ratio]))} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
