"""What live recovery costs in steady state: steps per second of one DDP job, plain against LiveGroup.

The same MLP, data and optimizer (bench/live_overhead_rank.py) in four configurations, each run alone:

- plain DDP under torchrun (`python -m torch.distributed.run --standalone`): DDP's default 25 MB buckets;
- LiveGroup under torchrun: no live recovery there, so only `live.ddp`'s wrapper differs (its bucket layout
  fixed at construction, so that a rebuilt wrapper sums bit-identically: taskd/worker/torch_buckets.py);
- LiveGroup under `taskd run`: live recovery on, the per-step vote (a one-element allreduce before the
  optimizer step), the heartbeat write, the control-file and leave watches;
- the same without the vote (the optimizer handed over as an extra object: no optimizer hooks).

Measured per configuration, over the steps after the warm-up: the job's CPU seconds per step, summed over
every process of it (ranks and launcher: taskd's agent, torchrun's), which other processes' load moves far
less than wall time, and rank 0's steps per second beside it. Each repetition runs every configuration once,
in alternating order (reversed on odd repetitions) so that the machine's drift hits them alike; a
configuration's cost is paired with plain DDP's of the same repetition. Repetitions go on until every CPU
cost's 95 % interval (Student's t over the repetitions) is narrower than ±--target points, from --min-reps up
to --max-reps, and the table prints the intervals (mean ± half-width), not a median.

    python bench/live_overhead.py [--quick] [--ranks 2,4,8] [--sizes 9m,100m] [--steps 40] [--target 1.5]
        [--min-reps 3] [--max-reps 20] [--configs live-taskd,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    bench_env,
    fmt,
    fmt_interval,
    has_torch,
    header,
    interval95,
    narrow_enough,
    run_job,
    table,
    write_result,
)

RANK = ROOT / "bench" / "live_overhead_rank.py"
TASKD_DRIVER = ROOT / "bench" / "run_taskd.py"
TORCHRUN_DRIVER = ROOT / "bench" / "run_torchrun.py"
SIZES = {"0.7m": (512, 3), "9m": (2048, 3), "100m": (4096, 7)}  # hidden, layers: 0.66, 8.9 and 101 M parameters
CONFIGS = (  # label, launcher, rank mode, name for --configs
    ("plain DDP, torchrun", "torchrun", "plain", "plain"),
    ("LiveGroup, torchrun (buckets only)", "torchrun", "live", "live-torchrun"),
    ("LiveGroup, taskd run (live, vote)", "taskd", "live", "live-taskd"),
    ("LiveGroup, taskd run (live, no vote)", "taskd", "live-novote", "live-taskd-novote"),
)


def run_once(launcher: str, mode: str, ranks: int, size: str, steps: int, warmup: int, work: Path,
             timeout: float) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    hidden, layers = SIZES[size]
    argv = [str(RANK), mode, str(work), str(steps), str(hidden), str(layers), str(warmup)]
    if launcher == "taskd":
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(ranks), "--log-dir", str(work / "logs"),
               *argv]
    else:
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(ranks), *argv]
    try:
        proc = run_job(cmd, timeout, cwd=work, env=bench_env(BENCH_PID=str(os.getpid())))
    except subprocess.TimeoutExpired:  # its processes killed with it: none outlives the bench
        return {"ok": False, "error": f"{launcher} job did not finish in {timeout:.0f} s: killed with its ranks"}
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:]}
    data = json.loads((work / "rank0.json").read_text())
    return {"ok": True, "times": data["times"], "params": data["params"], "cpu": data.get("cpu", [])}


def steps_per_second(times: list[float], warmup: int) -> float | None:
    measured = times[warmup:]
    if len(measured) < 2 or measured[-1] <= measured[0]:
        return None
    return (len(measured) - 1) / (measured[-1] - measured[0])


def cpu_per_step(cpu: list[float | None], steps: int, warmup: int) -> float | None:
    """The job's CPU seconds per step between the readings after step `warmup` and after the last step (the
    steps steps_per_second times)."""
    if len(cpu) != 2 or None in cpu or steps - warmup - 1 < 1:
        return None
    return (cpu[1] - cpu[0]) / (steps - warmup - 1)  # type: ignore[operator]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="2 ranks, a 0.7 M model, 12 steps, plain DDP and LiveGroup under taskd run, 2 repetitions")
    p.add_argument("--ranks", default="2,4,8", help="ranks per job, comma-separated")
    p.add_argument("--sizes", default="9m", help=f"model sizes, comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--steps", type=int, default=40, help="steps per job")
    p.add_argument("--warmup", type=int, default=8, help="steps left out of the rate (DDP's bucket rebuild, caches)")
    p.add_argument("--target", type=float, default=1.5,
                   help="stop once every CPU cost's 95 %% interval is narrower than ± this many points")
    p.add_argument("--min-reps", type=int, default=3, help="repetitions of every configuration, at least")
    p.add_argument("--max-reps", type=int, default=20, help="... and at most (the cap when noise stays wide)")
    p.add_argument("--reps", type=int, default=0, help="exactly this many repetitions (sets both bounds)")
    p.add_argument("--configs", default="", help="only these configurations, comma-separated, of "
                   f"{', '.join(c[3] for c in CONFIGS[1:])} (plain DDP, the baseline, always runs)")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one job may take")
    args = p.parse_args()
    if args.quick:
        args.ranks, args.sizes, args.steps, args.warmup, args.reps = "2", "0.7m", 12, 4, 2
        args.configs = args.configs or "live-taskd"
    if args.reps:
        args.min_reps = args.max_reps = args.reps
    args.size_list = [s for s in args.sizes.split(",") if s]
    args.rank_list = [int(r) for r in args.ranks.split(",") if r]
    names = [x for x in args.configs.split(",") if x]
    args.chosen = [c for c in CONFIGS if c is CONFIGS[0] or not names or c[3] in names]
    if not args.rank_list or min(args.rank_list) < 2 or any(s not in SIZES for s in args.size_list) \
            or args.steps < args.warmup + 3 or not 2 <= args.min_reps <= args.max_reps or args.target <= 0 \
            or len(args.chosen) < 2 or any(x not in {c[3] for c in CONFIGS} for x in names):
        p.error(f"--ranks must list sizes >= 2, --sizes of {', '.join(SIZES)}, --steps >= --warmup + 3, "
                "2 <= --min-reps <= --max-reps (an interval needs 2), --target > 0, --configs of the names above")
    return args


def measure(args: argparse.Namespace, n: int, size: str, tmp: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Repetitions of every chosen configuration at n ranks and `size` until the CPU costs' intervals are narrow
    enough (or --max-reps); returns per configuration its per-repetition values and paired costs."""
    base = args.chosen[0][0]
    per: dict[str, dict[str, list[float]]] = {c[0]: {"rate": [], "cpu": [], "cost": [], "cpu_cost": []}
                                              for c in args.chosen}
    params = None
    for rep in range(args.max_reps):
        got: dict[str, tuple[float | None, float | None]] = {}
        for i, (label, launcher, mode, _) in enumerate(args.chosen if rep % 2 == 0 else args.chosen[::-1]):
            r = run_once(launcher, mode, n, size, args.steps, args.warmup, tmp / f"{size}-{n}-{rep}-{i}",
                         args.run_timeout)
            rate = steps_per_second(r["times"], args.warmup) if r["ok"] else None
            cpu = cpu_per_step(r["cpu"], args.steps, args.warmup) if r["ok"] else None
            params = r.get("params", params)
            got[label] = (rate, cpu)
            result["runs"].append({"config": label, "ranks": n, "size": size, "rep": rep, "ok": r["ok"],
                                   "steps_per_s": rate, "cpu_s_per_step": cpu, "error": r.get("error")})
            print(f"{label} {n} ranks {size} rep {rep}: " + (f"failed: {r['error'][-300:]}" if not r["ok"] else
                  f"{fmt(rate, 3)} steps/s, {fmt(cpu and cpu * 1e3, 2)} CPU ms/step"), flush=True)
        base_rate, base_cpu = got[base]
        for label, (rate, cpu) in got.items():
            if rate and cpu:
                per[label]["rate"].append(rate)
                per[label]["cpu"].append(cpu)
                if base_rate and base_cpu:  # paired with the baseline of the same repetition
                    per[label]["cost"].append((1 - rate / base_rate) * 100)
                    per[label]["cpu_cost"].append((cpu / base_cpu - 1) * 100)
        cpu_costs = [interval95(per[c[0]]["cpu_cost"]) for c in args.chosen[1:]]
        if rep + 1 >= args.min_reps and narrow_enough(cpu_costs, args.target):
            break
    return {"params": params, "per": per}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still ends its job (run_job)
    args = parse_args()
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return 2
    result = header("live_overhead", args)
    result.update({"ranks": args.rank_list, "sizes": args.size_list, "steps": args.steps, "warmup": args.warmup,
                   "target_points": args.target, "min_reps": args.min_reps, "max_reps": args.max_reps,
                   "configs": [c[0] for c in args.chosen], "runs": [], "summary": {}})
    rows = []
    with tempfile.TemporaryDirectory(prefix="taskd-bench-overhead-") as tmp:
        for size in args.size_list:
            for n in args.rank_list:
                m = measure(args, n, size, Path(tmp), result)
                params = m["params"]
                for label, *_ in args.chosen:
                    v = m["per"][label]
                    rate, cpu = interval95(v["rate"]), interval95(v["cpu"])
                    cost, cpu_cost = interval95(v["cost"]), interval95(v["cpu_cost"])
                    baseline = label == args.chosen[0][0]
                    result["summary"][f"{label}/{n}/{size}"] = {
                        "reps": len(v["rate"]), "steps_per_s": rate, "cpu_s_per_step": cpu,
                        "cost_pct": None if baseline else cost, "cpu_cost_pct": None if baseline else cpu_cost,
                        "each": v}
                    rows.append([label, n, f"{params / 1e6:.1f} M" if params else size, len(v["rate"]),
                                 fmt_interval(rate, 3), "-" if baseline else fmt_interval(cost),
                                 fmt_interval({**cpu, "mean": cpu["mean"] and cpu["mean"] * 1e3,
                                               "half": cpu["half"] and cpu["half"] * 1e3}, 2),
                                 "-" if baseline else fmt_interval(cpu_cost)])
    print(f"\nSteady state after the warm-up, mean ± 95 % interval over the repetitions (until every CPU cost's is "
          f"narrower than ±{args.target} points, at most {args.max_reps}); costs paired with plain DDP's repetition")
    print(table(["configuration", "ranks", "parameters", "reps", "steps/s (rank 0)", "wall cost vs plain %",
                 "job CPU ms/step", "CPU cost vs plain %"], rows, 3))
    write_result("live_overhead", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
