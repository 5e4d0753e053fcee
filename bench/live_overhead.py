"""What live recovery costs in steady state: steps per second of one DDP job, plain against LiveGroup.

The same MLP, data and optimizer (bench/live_overhead_rank.py) in four configurations, each run alone:

- plain DDP under torchrun (`python -m torch.distributed.run --standalone`): DDP's default 25 MB buckets;
- LiveGroup under torchrun: no live recovery there, so only `live.ddp`'s wrapper differs (its bucket layout
  fixed at construction, so that a rebuilt wrapper sums bit-identically: taskd/worker/torch_buckets.py);
- LiveGroup under `taskd run`: live recovery on, the per-step vote (a one-element allreduce before the
  optimizer step), the heartbeat write, the control-file and leave watches;
- the same without the vote (the optimizer handed over as an extra object: no optimizer hooks).

Steps per second are rank 0's, over the steps after the warm-up, median of `--reps` runs; the
configurations alternate within each repetition so that the machine's drift hits them alike.

    python bench/live_overhead.py [--quick] [--ranks 2,4,8] [--sizes 9m,100m] [--steps 40] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, bench_env, fmt, has_torch, header, table, write_result

RANK = ROOT / "bench" / "live_overhead_rank.py"
TASKD_DRIVER = ROOT / "bench" / "run_taskd.py"
TORCHRUN_DRIVER = ROOT / "bench" / "run_torchrun.py"
SIZES = {"9m": (2048, 3), "100m": (4096, 7)}  # hidden, layers: 8.9 M and 101 M parameters
CONFIGS = (  # label, launcher, rank mode
    ("plain DDP, torchrun", "torchrun", "plain"),
    ("LiveGroup, torchrun (buckets only)", "torchrun", "live"),
    ("LiveGroup, taskd run (live, vote)", "taskd", "live"),
    ("LiveGroup, taskd run (live, no vote)", "taskd", "live-novote"),
)


def run_once(launcher: str, mode: str, ranks: int, size: str, steps: int, work: Path, timeout: float) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    hidden, layers = SIZES[size]
    argv = [str(RANK), mode, str(work), str(steps), str(hidden), str(layers)]
    if launcher == "taskd":
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(ranks), "--log-dir", str(work / "logs"),
               *argv]
    else:
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(ranks), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=work, env=bench_env())
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:]}
    data = json.loads((work / "rank0.json").read_text())
    return {"ok": True, "times": data["times"], "params": data["params"]}


def steps_per_second(times: list[float], warmup: int) -> float | None:
    measured = times[warmup:]
    if len(measured) < 2 or measured[-1] <= measured[0]:
        return None
    return (len(measured) - 1) / (measured[-1] - measured[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 ranks, the small model, 12 steps, 1 repetition")
    p.add_argument("--ranks", default="2,4,8", help="ranks per job, comma-separated")
    p.add_argument("--sizes", default="9m", help=f"model sizes, comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--steps", type=int, default=40, help="steps per job")
    p.add_argument("--warmup", type=int, default=8, help="steps left out of the rate (DDP's bucket rebuild, caches)")
    p.add_argument("--reps", type=int, default=2, help="repetitions of every configuration")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one job may take")
    args = p.parse_args()
    if args.quick:
        args.ranks, args.sizes, args.steps, args.warmup, args.reps = "2", "9m", 12, 4, 1
    sizes = [s for s in args.sizes.split(",") if s]
    ranks = [int(r) for r in args.ranks.split(",") if r]
    if not ranks or min(ranks) < 2 or any(s not in SIZES for s in sizes) or args.steps < args.warmup + 3 \
            or args.reps < 1:
        p.error(f"--ranks must list sizes >= 2, --sizes of {', '.join(SIZES)}, --steps >= --warmup + 3, --reps >= 1")
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return 2
    result = header("live_overhead", args)
    result.update({"ranks": ranks, "sizes": sizes, "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                   "runs": [], "summary": {}})
    rows = []
    with tempfile.TemporaryDirectory(prefix="taskd-bench-overhead-") as tmp:
        for size in sizes:
            for n in ranks:
                rates: dict[str, list[float]] = {label: [] for label, _, _ in CONFIGS}
                params = None
                for rep in range(args.reps):
                    for i, (label, launcher, mode) in enumerate(CONFIGS):
                        r = run_once(launcher, mode, n, size, args.steps, Path(tmp) / f"{size}-{n}-{rep}-{i}",
                                     args.run_timeout)
                        rate = steps_per_second(r["times"], args.warmup) if r["ok"] else None
                        params = r.get("params", params)
                        result["runs"].append({"config": label, "ranks": n, "size": size, "rep": rep, "ok": r["ok"],
                                               "steps_per_s": rate, "error": r.get("error")})
                        print(f"{label} {n} ranks {size} rep {rep}: "
                              f"{'failed: ' + r['error'][-300:] if not r['ok'] else fmt(rate, 3) + ' steps/s'}",
                              flush=True)
                        if rate is not None:
                            rates[label].append(rate)
                base = statistics.median(rates[CONFIGS[0][0]]) if rates[CONFIGS[0][0]] else None
                for label, _, _ in CONFIGS:
                    rate = statistics.median(rates[label]) if rates[label] else None
                    cost = (1 - rate / base) * 100 if rate and base else None
                    result["summary"][f"{label}/{n}/{size}"] = {"steps_per_s": rate, "cost_pct": cost,
                                                               "each": rates[label]}
                    rows.append([label, n, f"{params / 1e6:.1f} M" if params else size, fmt(rate, 3),
                                 "-" if label == CONFIGS[0][0] else fmt(cost, 1)])
    print("\nSteady-state steps per second (rank 0, after the warm-up; median of the repetitions)")
    print(table(["configuration", "ranks", "parameters", "steps/s", "cost vs plain DDP %"], rows, 3))
    write_result("live_overhead", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
