"""What live recovery costs in steady state: LiveGroup against plain DDP, as the job's CPU seconds per step.

Two methods (--method):

``paired`` (the default; bench/live_overhead_paired.py says why and how): inside one `taskd run` job, blocks of
--block steps alternate with and without LiveGroup's per-step work in the same processes, each block's CPU summed
over the job's processes (every rank's, all threads, and the launcher's); each pair's difference is a share of the
"off" block's CPU. What a job cannot switch off is measured beside it: the launcher's CPU per step (taskd's agent
against torchrun's, from a torchrun job running the same script, which is also the null check: there the switch
must read ~0) and taskd's Python threads in the ranks. Jobs of --pairs pairs are pooled until the total's 95 %
interval is narrower than ±--target points (at most --max-jobs jobs).

``jobs`` (the earlier method): whole jobs in four configurations, each run alone:

- plain DDP under torchrun (`python -m torch.distributed.run --standalone`): DDP's default 25 MB buckets;
- LiveGroup under torchrun: no live recovery there, so only `live.ddp`'s wrapper differs (its bucket layout
  fixed at construction, so that a rebuilt wrapper sums bit-identically: taskd/worker/torch_buckets.py);
- LiveGroup under `taskd run`: live recovery on, the per-step vote (a one-element allreduce before the
  optimizer step), the heartbeat write, the control-file and leave watches;
- the same without the vote (the optimizer handed over as an extra object: no optimizer hooks).

Measured per configuration, over the steps after the warm-up: the job's CPU seconds per step, summed over
every process of it (ranks and launcher: taskd's agent, torchrun's), and rank 0's steps per second beside it.
Each repetition runs every configuration once, in alternating order (reversed on odd repetitions); a
configuration's cost is paired with plain DDP's of the same repetition. Repetitions go on until every CPU
cost's 95 % interval (Student's t over the repetitions) is narrower than ±--target points, from --min-reps up
to --max-reps. A pair of 40-step jobs differs by ~9 points (SD) here, so this method needs ~150 pairs for ±1.5.

Both print the intervals (mean ± half-width), not a median.

    python bench/live_overhead.py [--quick] [--ranks 4] [--sizes 9m] [--block 10] [--pairs 20] [--max-jobs 4]
        [--target 1.5]
    python bench/live_overhead.py --method jobs [--ranks 2,4,8] [--steps 40] [--min-reps 3] [--max-reps 20]
        [--configs live-taskd,...]
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
from live_overhead_paired import Pooled, run_paired, summary

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
    p.add_argument("--quick", action="store_true", help="2 ranks, a 0.7 M model; paired: 4 pairs of 2-step blocks, "
                   "one job each; jobs: 12 steps, plain DDP and LiveGroup under taskd run, 2 repetitions")
    p.add_argument("--method", choices=("paired", "jobs"), default="paired",
                   help="paired: blocks with and without LiveGroup's per-step work inside one job; jobs: whole jobs")
    p.add_argument("--block", type=int, default=10, help="paired: steps per block")
    p.add_argument("--pairs", type=int, default=20, help="paired: pairs of blocks (on, off) per job")
    p.add_argument("--max-jobs", type=int, default=4, help="paired: taskd jobs at most, their pairs pooled")
    p.add_argument("--null-jobs", type=int, default=1, help="paired: torchrun jobs (launcher CPU, null check)")
    p.add_argument("--ranks", default="4", help="ranks per job, comma-separated")
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
        args.block, args.pairs, args.max_jobs, args.null_jobs = 2, 4, 1, 1
        args.configs = args.configs or "live-taskd"
    if args.reps:
        args.min_reps = args.max_reps = args.reps
    args.size_list = [s for s in args.sizes.split(",") if s]
    args.rank_list = [int(r) for r in args.ranks.split(",") if r]
    names = [x for x in args.configs.split(",") if x]
    args.chosen = [c for c in CONFIGS if c is CONFIGS[0] or not names or c[3] in names]
    if not args.rank_list or min(args.rank_list) < 2 or any(s not in SIZES for s in args.size_list) \
            or args.steps < args.warmup + 3 or not 2 <= args.min_reps <= args.max_reps or args.target <= 0 \
            or len(args.chosen) < 2 or any(x not in {c[3] for c in CONFIGS} for x in names) \
            or args.block < 1 or args.pairs < 2 or args.max_jobs < 1 or args.null_jobs < 1:
        p.error(f"--ranks must list sizes >= 2, --sizes of {', '.join(SIZES)}, --steps >= --warmup + 3, "
                "2 <= --min-reps <= --max-reps (an interval needs 2), --target > 0, --configs of the names above, "
                "--block >= 1, --pairs >= 2, --max-jobs and --null-jobs >= 1")
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


def measure_paired(args: argparse.Namespace, n: int, size: str, tmp: Path,
                   result: dict[str, Any]) -> tuple[Pooled, Pooled, dict[str, Any]]:
    """Torchrun jobs (--null-jobs), then taskd jobs until the total's interval is narrow enough or --max-jobs."""
    hidden, layers = SIZES[size]
    live, null = Pooled(), Pooled()
    s: dict[str, Any] = {}
    for job in range(max(args.max_jobs, args.null_jobs)):
        for launcher, pool in (("torchrun", null), ("taskd", live)):
            if job >= (args.null_jobs if launcher == "torchrun" else args.max_jobs):
                continue
            r = run_paired(launcher, n, hidden, layers, args.pairs, args.block, args.warmup,
                           tmp / f"{size}-{n}-{launcher}-{job}", args.run_timeout)
            result["runs"].append({"launcher": launcher, "ranks": n, "size": size, "job": job, "ok": r["ok"],
                                   "records": r.get("ranks"), "error": r.get("error")})
            if not r["ok"]:
                print(f"{launcher} job {job}: failed: {r['error'][-300:]}", flush=True)
                continue
            pool.add(r["ranks"])
            s = summary(live, null, args.block)
            print(f"{launcher} job {job} ({n} ranks, {size}): {len(pool.pairs['cpu_cost'])} pairs pooled; per-step "
                  f"work {fmt_interval(s['per_step'])} %, total {fmt_interval(s['total'])} %, null check "
                  f"{fmt_interval(s['null'])} %, load {os.getloadavg()[0]:.1f}", flush=True)
        if job + 1 >= args.null_jobs and narrow_enough([s["total"], s["per_step"]], args.target):
            break
    return live, null, s


def main_paired(args: argparse.Namespace, result: dict[str, Any]) -> int:
    result.update({"method": "paired", "ranks": args.rank_list, "sizes": args.size_list, "block": args.block,
                   "pairs_per_job": args.pairs, "warmup": args.warmup, "target_points": args.target,
                   "max_jobs": args.max_jobs, "null_jobs": args.null_jobs, "runs": [], "summary": {}})
    ok = True
    with tempfile.TemporaryDirectory(prefix="taskd-bench-overhead-") as tmp:
        for size in args.size_list:
            for n in args.rank_list:
                live, null, s = measure_paired(args, n, size, Path(tmp), result)
                if not live.pairs["cpu_cost"] or not null.pairs["cpu_cost"]:
                    ok = False
                    continue
                result["summary"][f"{n}/{size}"] = {**s, "pairs": len(live.pairs["cpu_cost"]),
                                                    "null_pairs": len(null.pairs["cpu_cost"]),
                                                    "thread_names": live.threads, "params": live.params,
                                                    "launcher_processes": live.launcher_processes}
                print_paired(args, n, live, null, s)
    write_result("live_overhead", result)
    return 0 if ok else 1


def print_paired(args: argparse.Namespace, n: int, live: Pooled, null: Pooled, s: dict[str, Any]) -> None:
    pairs, npairs = len(live.pairs["cpu_cost"]), len(null.pairs["cpu_cost"])
    print(f"\nLiveGroup's steady-state cost at {n} ranks, {live.params / 1e6:.1f} M parameters: the job's CPU seconds "
          f"per step (every rank's process CPU, all threads, and the launcher's), in points of the job's CPU per step "
          f"without LiveGroup's per-step work ({fmt_interval(s['step_ms'], 2)} ms); mean ± 95 % interval "
          f"(Student's t), not a median. Load average now {os.getloadavg()[0]:.1f}.")
    rows = [
        ["per-step work: vote, collective mark, heartbeat, reseed, control stat",
         f"blocks of {args.block} steps on/off alternating in the taskd job, paired", pairs,
         fmt_interval(s["per_step"], 2)],
        [f"launcher: taskd's agent {fmt_interval(s['agent_ms'], 2)} against torchrun's "
         f"{fmt_interval(s['torchrun_ms'], 2)} CPU ms/step", "per block, taskd job against torchrun job",
         f"{2 * pairs}/{2 * npairs}", fmt_interval(s["launcher"], 2)],
        [f"taskd's threads in the ranks ({', '.join(live.threads) or 'none'})",
         "their CPU per block, every rank", len(live.threads_per_step), fmt_interval(s["threads"], 2)],
        ["**total**", "the sum; half-widths in quadrature", "", f"**{fmt_interval(s['total'], 2)}**"],
        ["null check: the same switch under torchrun (nothing live)", "paired as the first row", npairs,
         fmt_interval(s["null"], 2)],
    ]
    print(table(["part of the cost", "measured", "n", "CPU cost vs plain %"], rows))
    print(f"\nBeside it, wall time (rank 0) of the on blocks against the off blocks: {fmt_interval(s['wall'])} % "
          f"({pairs} pairs; the load moves it far more than CPU). The DDP wrapper's fixed buckets are plain DDP's "
          "rebuilt layout at this model (tests/e2e/worker/test_stable_buckets.py): no steady-state part here; "
          "--method jobs compares whole jobs.")


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still ends its job (run_job)
    args = parse_args()
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return 2
    result = header("live_overhead", args)
    if args.method == "paired":
        return main_paired(args, result)
    result.update({"method": "jobs", "ranks": args.rank_list, "sizes": args.size_list, "steps": args.steps,
                   "warmup": args.warmup, "target_points": args.target, "min_reps": args.min_reps,
                   "max_reps": args.max_reps, "configs": [c[0] for c in args.chosen], "runs": [], "summary": {}})
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
