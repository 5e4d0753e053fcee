"""What a live replacement's state hand-over costs: `taskd.worker.torch_state.hand_over` between real ranks.

The example's model (examples/torch/train_ddp.py's MLP, 8.9 M parameters) and SGD with momentum after
one step: 36 MB of parameters and 36 MB of momentum go from rank 0 to the other ranks, over gloo on
loopback, as in a live recovery with a replacement. Reported: seconds per hand-over, from a barrier
before to a barrier after, over `--reps` hand-overs; and, for scale, the same bytes sent as two plain
tensors (what no hand-over can beat).

    python bench/hand_over.py [--quick] [--ranks 2] [--reps 10] [--hidden 2048] [--layers 3]

Run it at another commit with `PYTHONPATH=<that checkout> python bench/hand_over.py` for a before/after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, bench_env, has_torch, header, table, write_result


def rank_main(args: argparse.Namespace) -> int:
    """One rank: time `--reps` hand-overs and `--reps` raw sends; rank 1 prints them as JSON."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    import train_ddp  # the example's model: what the benchmark of the real job hands over

    from taskd.worker.torch_state import hand_over

    dist.init_process_group("gloo", store=dist.FileStore(args.store, args.ranks), rank=args.rank,
                            world_size=args.ranks, timeout=timedelta(seconds=120))
    example = train_ddp.parse_args(["--steps", "1", "--ckpt-every", "0", "--ckpt-dir", "-", "--out", "-",
                                    "--hidden", str(args.hidden), "--layers", str(args.layers)])
    model = train_ddp.make_model(example)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.rank == 0:  # the source has momentum; the others have none, as a replacement
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
    lacking = list(range(1, args.ranks))
    times: dict[str, list[float]] = {"hand_over": [], "two_tensors": []}
    raw = [torch.cat([p.detach().flatten() for p in model.parameters()]) for _ in range(2)]
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        hand_over(0, lacking, model, optimizer, {}, [])
        dist.barrier()
        times["hand_over"].append(time.perf_counter() - t0)
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        for t in raw:
            if args.rank == 0:
                for dst in lacking:
                    dist.send(t, dst)
            else:
                dist.recv(t, 0)
        dist.barrier()
        times["two_tensors"].append(time.perf_counter() - t0)
    if args.rank == 1:
        momentum = sum(float(s["momentum_buffer"].sum()) for s in optimizer.state_dict()["state"].values())
        print(json.dumps({**times, "momentum_sum": momentum,
                          "megabytes": 2 * sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6}))
    elif args.rank == 0:
        momentum = sum(float(s["momentum_buffer"].sum()) for s in optimizer.state_dict()["state"].values())
        print(json.dumps({"momentum_sum": momentum}))
    dist.destroy_process_group()
    return 0


def drive(args: argparse.Namespace) -> int:
    if not has_torch():
        print("torch is not installed: nothing to hand over (pip install torch==2.13.0, a CPU build)")
        return 0
    data = header("hand_over", args)
    with tempfile.TemporaryDirectory(prefix="taskd-hand-over-") as tmp:
        store = str(Path(tmp) / "store")
        base = [sys.executable, __file__, "--store", store, "--ranks", str(args.ranks), "--reps", str(args.reps),
                "--hidden", str(args.hidden), "--layers", str(args.layers)]
        procs = [subprocess.Popen([*base, "--rank", str(r)], stdout=subprocess.PIPE, text=True, env=bench_env())
                 for r in range(args.ranks)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        print(f"a rank failed: exit codes {[p.returncode for p in procs]}")
        return 1
    result = json.loads(outs[1].strip().splitlines()[-1])
    source = json.loads(outs[0].strip().splitlines()[-1])
    data.update(result, state_equal=result["momentum_sum"] == source["momentum_sum"])
    rows = [[what, args.ranks, round(result["megabytes"], 1), statistics.median(result[what]),
             min(result[what]), max(result[what])] for what in ("hand_over", "two_tensors")]
    print(table(["what", "ranks", "MB", "p50 s", "min s", "max s"], rows, digits=3))
    print(f"the receiver's momentum equals the source's: {data['state_equal']}")
    write_result("hand_over", data)
    return 0 if data["state_equal"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small model, 2 reps: checks the script works")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ranks < 2:
        p.error("--ranks must be at least 2 (a source and a receiver)")
    if args.quick:
        args.reps, args.hidden, args.layers = 2, 64, 2
    return rank_main(args) if args.rank is not None else drive(args)


if __name__ == "__main__":
    sys.exit(main())
