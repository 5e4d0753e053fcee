"""In-memory snapshots against torch.save to disk, side by side in one run, on one model (issue 33).

One process trains an MLP with AdamW (about 100 MB of model and optimizer state with the defaults) and saves
its state every k steps, k = 1, 5, 20, with each method:

- ``taskd``: `taskd.worker.torch_snapshot.TorchSnapshots.save` into a directory in /dev/shm (the call copies the
  state into a shared-memory segment; the checksum and the publish run on a thread);
- ``torch.save``: ``torch.save`` of the same state dicts to a file on disk, fsynced (what a checkpoint that
  survives the process costs), blocking.

Measured per method and k: each save's blocking time (the call, as the training loop sees it) and the steady
state: steps/s over the run against the same steps with no saves (the rounds interleaved so that the machine's
load moves all alike), and the process's CPU time per step (the publishing thread's included), which other
processes' load does not move. Each round runs every configuration once (in alternating order); a
configuration's costs are paired with the no-save run of the same round, and rounds go on until every CPU
cost's 95 % interval (Student's t over the rounds) is narrower than ±--target points, from --min-rounds up to
--max-rounds; the table prints the intervals (mean ± half-width), not a median. Then restore time: from memory
(`TorchSnapshots.restore` in a fresh process state, into a fresh model and optimizer) against from disk
(``torch.load`` + ``load_state_dict``), the file's pages dropped from the page cache first
(``posix_fadvise(DONTNEED)``, after its fsync) and kept ("warm").

    PYTHONPATH=. python bench/snapshots.py [--hidden 1024 --layers 8 --steps 40] [--target 1.5]
        [--min-rounds 3] [--max-rounds 20] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from common import fmt_interval, header, interval95, narrow_enough, stats, table, write_result  # noqa: E402
from torch import nn  # noqa: E402

from taskd.worker.torch_snapshot import TorchSnapshots  # noqa: E402

KS = (1, 5, 20)
METHODS = ("taskd", "torch.save")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40, help="steps per measured run")
    p.add_argument("--target", type=float, default=1.5,
                   help="stop once every CPU cost's 95 %% interval is narrower than ± this many points")
    p.add_argument("--min-rounds", type=int, default=3, help="rounds, each running every configuration once, at least")
    p.add_argument("--max-rounds", type=int, default=20, help="... and at most (the cap when noise stays wide)")
    p.add_argument("--rounds", type=int, default=0, help="exactly this many rounds (sets both bounds)")
    p.add_argument("--restores", type=int, default=5)
    p.add_argument("--disk", default=None, help="directory for torch.save's files (default: a temporary one)")
    p.add_argument("--quick", action="store_true", help="a small model, few steps (a smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.steps, args.rounds, args.restores = 128, 2, 6, 2, 2
    if args.rounds:
        args.min_rounds = args.max_rounds = args.rounds
    if not 2 <= args.min_rounds <= args.max_rounds or args.target <= 0:
        p.error("2 <= --min-rounds <= --max-rounds (an interval needs 2 rounds) and --target > 0")
    return args


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(args.hidden, args.hidden), nn.Tanh())])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors a save writes, once the optimizer has its moments (after a step)."""
    model(torch.randn(2, next(model.parameters()).shape[1])).sum().backward()
    optimizer.step()
    tensors = list(model.state_dict().values())
    tensors += [t for s in optimizer.state_dict()["state"].values() for t in s.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


class Disk:
    """torch.save of the state dicts to a file, fsynced; restore reads it back."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "state.pt")

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as fh:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def drop_cache(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        saved = torch.load(self.path, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        return int(saved["step"])


def train(args: argparse.Namespace, method: str | None, k: int, shm: str, disk: Disk) -> dict[str, Any]:
    """One run of ``args.steps`` steps saving every ``k`` with ``method`` (None: no saves)."""
    model, optimizer = build(args)
    snaps = TorchSnapshots(model, optimizer, directory=shm) if method == "taskd" else None
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1))
    saves: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for step in range(1, args.steps + 1):
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if method is not None and step % k == 0:
            t0 = time.perf_counter()
            if snaps is not None:
                snaps.save(step)
            else:
                disk.save(model, optimizer, step)
            saves.append(time.perf_counter() - t0)
    if snaps is not None:
        snaps.close()  # the last publish: counted in the run's time
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {"steps_per_s": args.steps / elapsed, "cpu_per_step": cpu / args.steps, "saves": saves}


def measure_restores(args: argparse.Namespace, shm: str, disk: Disk) -> dict[str, list[float]]:
    model, optimizer = build(args)
    loss = model(torch.randn(2, args.hidden)).sum()
    loss.backward()
    optimizer.step()  # the optimizer has its moments: the state a restore brings back
    TorchSnapshots(model, optimizer, directory=shm, background=False).save(1)
    disk.save(model, optimizer, 1)
    out: dict[str, list[float]] = {"memory": [], "disk (cache dropped)": [], "disk (page cache)": []}
    for _ in range(args.restores):
        fresh = build(args)
        t0 = time.perf_counter()
        assert TorchSnapshots(*fresh, directory=shm).restore() == 1
        out["memory"].append(time.perf_counter() - t0)
        disk.drop_cache()
        fresh = build(args)
        t0 = time.perf_counter()
        disk.restore(*fresh)
        out["disk (cache dropped)"].append(time.perf_counter() - t0)
        fresh = build(args)
        t0 = time.perf_counter()
        disk.restore(*fresh)
        out["disk (page cache)"].append(time.perf_counter() - t0)
    return out


def paired_costs(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[float]]]:
    """Per configuration, its wall and CPU cost (%) in each round against that round's no-save run."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, items in runs.items():
        pairs = list(zip(items, runs["none"], strict=False))
        out[name] = {"cost": [100.0 * (1.0 - r["steps_per_s"] / b["steps_per_s"]) for r, b in pairs],
                     "cpu_cost": [100.0 * (r["cpu_per_step"] / b["cpu_per_step"] - 1.0) for r, b in pairs]}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its /dev/shm directory
    torch.set_num_threads(1)
    os.environ.pop("TASKD_SNAPSHOT_DIR", None)
    result = header("snapshots", args)
    model, optimizer = build(args)
    result["state_bytes"] = state_bytes(model, optimizer)
    print(f"state: {result['state_bytes'] / 1e6:.1f} MB (model + AdamW moments), {args.steps} steps per run, "
          f"{args.min_rounds}-{args.max_rounds} rounds (until every CPU cost is known within ±{args.target} points)",
          flush=True)
    configs: list[tuple[str | None, int]] = [(None, 0)] + [(m, k) for k in KS for m in METHODS]
    runs: dict[str, list[dict[str, Any]]] = {}
    disk_dir = tempfile.mkdtemp(prefix="taskd-bench-disk-", dir=args.disk)
    try:
        for r in range(args.max_rounds):
            for method, k in configs if r % 2 == 0 else configs[::-1]:
                shm = tempfile.mkdtemp(prefix="taskd-bench-snap-", dir="/dev/shm")
                try:
                    name = "none" if method is None else f"{method} k={k}"
                    runs.setdefault(name, []).append(train(args, method, k, shm, Disk(disk_dir)))
                    print(f"round {r + 1}: {name}: {runs[name][-1]['steps_per_s']:.2f} steps/s", flush=True)
                finally:
                    shutil.rmtree(shm, ignore_errors=True)
            costs = paired_costs(runs)
            if r + 1 >= args.min_rounds and narrow_enough(
                    [interval95(c["cpu_cost"]) for name, c in costs.items() if name != "none"], args.target):
                break
        shm = tempfile.mkdtemp(prefix="taskd-bench-snap-", dir="/dev/shm")
        try:
            restores = measure_restores(args, shm, Disk(disk_dir))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)

    costs = paired_costs(runs)
    rows, summary = [], {}
    for name, items in runs.items():
        rate, cpu = interval95([r["steps_per_s"] for r in items]), interval95([r["cpu_per_step"] for r in items])
        cost, cpu_cost = interval95(costs[name]["cost"]), interval95(costs[name]["cpu_cost"])
        blocking = stats([s for r in items for s in r["saves"]], 1e3)
        summary[name] = {"rounds": len(items), "steps_per_s": rate["mean"], "cost_pct": cost["mean"],
                         "cpu_per_step": cpu["mean"], "cpu_cost_pct": cpu_cost["mean"], "save_ms": blocking,
                         "steps_per_s_interval": rate, "cost_pct_interval": cost, "cpu_per_step_interval": cpu,
                         "cpu_cost_pct_interval": cpu_cost}
        none = name == "none"
        cpu_ms = {**cpu, "mean": cpu["mean"] * 1e3, "half": cpu["half"] and cpu["half"] * 1e3}
        rows.append([name, len(items), fmt_interval(rate, 2), "-" if none else f"{fmt_interval(cost)} %",
                     fmt_interval(cpu_ms, 2), "-" if none else f"{fmt_interval(cpu_cost)} %", blocking["p50"],
                     blocking["max"]])
    print("steady state: mean ± 95 % interval over the rounds; costs paired with the same round's no-save run")
    print(table(["method", "rounds", "steps/s", "wall cost vs none", "CPU ms/step", "CPU cost vs none",
                 "save p50 ms", "save max ms"], rows))
    rrows = []
    for name, times in restores.items():
        s = stats(times, 1e3)
        summary[f"restore {name}"] = s
        rrows.append([name, s["p50"], s["max"]])
    print(table(["restore from", "p50 ms", "max ms"], rrows))
    result.update({"runs": runs, "restores": restores, "summary": summary})
    print(f"results: {write_result('snapshots', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
