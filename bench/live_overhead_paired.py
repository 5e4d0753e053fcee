"""bench/live_overhead.py's paired method: LiveGroup's steady-state cost from blocks inside one job.

Why not whole jobs: a pair of 40-step jobs (plain DDP against LiveGroup) differed by 9.1 points (SD) on this machine,
so ±1.5 would take ~150 pairs; the spread is per block of steps, not per job (start-up and warm-up are left out
either way), and load moves it, so the cure is many short comparisons close in time, in the same processes.

What is paired: in one `taskd run` job (live recovery on), blocks of --block steps alternate (on, off; off, on; ...)
in the same ranks (bench/live_overhead_rank.py, mode ``paired``): "on" runs LiveGroup's per-step work (the vote,
the backward's collective mark, the heartbeat, the reseed, the control file's stat), "off" the same training step
through the same DDP wrapper without it. A block's CPU is the job's: every rank's process CPU (all its threads,
gloo's included) and the launcher's (taskd's agent: it reads the heartbeats the "on" steps write) over the block.

What cannot be switched inside a job, and is measured beside it:
- the launcher's own CPU (taskd's agent against torchrun's): CPU per step of the job's non-rank processes over the
  measured blocks of the taskd job and of a torchrun job (the same paired script, where nothing live runs);
- taskd's Python threads in each rank (the leave watch): their CPU over each block, summed over ranks;
- the DDP wrapper's fixed buckets: at this model they are plain DDP's own rebuilt layout
  (tests/e2e/worker/test_stable_buckets.py), so no steady-state difference; ``--method jobs`` compares whole jobs.

The torchrun job is also the instrument's null check: the same switch where LiveGroup is not live (no vote, no mark,
no heartbeat file) must read ~0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import ROOT, bench_env, interval95, run_job

RANK = ROOT / "bench" / "live_overhead_rank.py"
DRIVERS = {"taskd": ROOT / "bench" / "run_taskd.py", "torchrun": ROOT / "bench" / "run_torchrun.py"}


def run_paired(launcher: str, ranks: int, hidden: int, layers: int, pairs: int, block: int, warmup: int,
               work: Path, timeout: float) -> dict[str, Any]:
    """One job of `pairs` pairs of blocks; its ranks' records (rank<r>.json), or the error."""
    work.mkdir(parents=True, exist_ok=True)
    argv = [str(RANK), "paired", str(work), str(pairs), str(hidden), str(layers), str(warmup), str(block)]
    if launcher == "taskd":
        cmd = [sys.executable, str(DRIVERS[launcher]), "--nproc-per-node", str(ranks), "--log-dir",
               str(work / "logs"), *argv]
    else:
        cmd = [sys.executable, str(DRIVERS[launcher]), "--standalone", "--nproc-per-node", str(ranks), *argv]
    try:
        proc = run_job(cmd, timeout, cwd=work, env=bench_env(BENCH_PID=str(os.getpid())))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"{launcher} job did not finish in {timeout:.0f} s: killed with its ranks"}
    files = sorted(work.glob("rank*.json"))
    if proc.returncode != 0 or len(files) != ranks:
        return {"ok": False, "error": (proc.stdout + proc.stderr)[-2000:]}
    return {"ok": True, "ranks": [json.loads(f.read_text()) for f in files]}


def blocks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per block: its kind, the job's CPU seconds (every rank's + the launcher's), rank 0's wall and the launcher's
    CPU alone."""
    r0 = next(r for r in records if r["rank"] == 0)
    return [{"kind": b["kind"], "cpu": sum(r["blocks"][i]["cpu"] for r in records) + b["launcher"],
             "wall": b["wall"], "launcher": b["launcher"]} for i, b in enumerate(r0["blocks"])]


def pair_costs(bl: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each pair's cost of "on" against "off" in % (CPU, wall), and the off block's CPU per step."""
    out: dict[str, list[float]] = {"cpu_cost": [], "wall_cost": [], "off_cpu": [], "off_wall": []}
    for a, b in zip(bl[::2], bl[1::2], strict=True):
        on, off = (a, b) if a["kind"] == "on" else (b, a)
        out["cpu_cost"].append((on["cpu"] / off["cpu"] - 1) * 100)
        out["wall_cost"].append((on["wall"] / off["wall"] - 1) * 100)
        out["off_cpu"].append(off["cpu"])
        out["off_wall"].append(off["wall"])
    return out


class Pooled:
    """The pairs of every job of one launcher, and what each job measured beside them."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[float]] = {"cpu_cost": [], "wall_cost": [], "off_cpu": [], "off_wall": []}
        self.launcher_per_step: list[float] = []  # per block, CPU s
        self.threads_per_step: list[float] = []  # per block, CPU s (every rank's Python threads)
        self.threads: list[str] = []
        self.launcher_processes: list[str] = []
        self.params = 0

    def add(self, records: list[dict[str, Any]]) -> None:
        bl = blocks(records)
        block = records[0]["block"]
        for k, v in pair_costs(bl).items():
            self.pairs[k] += v
        self.launcher_per_step += [b["launcher"] / block for b in bl]
        self.threads_per_step += [sum(r["blocks"][i].get("threads", 0.0) for r in records) / block
                                  for i in range(len(bl))]
        r0 = next(r for r in records if r["rank"] == 0)
        self.threads, self.launcher_processes, self.params = r0["threads"], r0["launcher_processes"], r0["params"]

    def step_cpu(self, block: int) -> dict[str, Any]:
        """The job's CPU seconds per step in the "off" blocks."""
        return interval95([c / block for c in self.pairs["off_cpu"]])


def combine(*parts: dict[str, Any]) -> dict[str, Any]:
    """The sum of independent estimates: means added, half-widths in quadrature (a part read once, with no
    half-width: a sum over every measured step, adds none)."""
    if any(p["mean"] is None for p in parts):
        return {"n": 0, "mean": None, "half": None}
    halves = [p["half"] or 0.0 for p in parts]
    return {"n": min(p["n"] for p in parts), "mean": sum(p["mean"] for p in parts),
            "half": sum(h * h for h in halves) ** 0.5}


def scaled(i: dict[str, Any], factor: float) -> dict[str, Any]:
    return {**i, "mean": None if i["mean"] is None else i["mean"] * factor,
            "half": None if i["half"] is None else i["half"] * factor}


def summary(live: Pooled, null: Pooled, block: int) -> dict[str, dict[str, Any]]:
    """The cost's parts in points of the job's CPU per step ("off" blocks of the taskd job), and their sum."""
    step = live.step_cpu(block)["mean"] or float("nan")
    agent, torchrun = interval95(live.launcher_per_step), interval95(null.launcher_per_step)
    launcher = scaled(combine(agent, scaled(torchrun, -1.0)), 100 / step)
    threads = scaled(interval95(live.threads_per_step), 100 / step)
    per_step = interval95(live.pairs["cpu_cost"])
    return {"per_step": per_step, "launcher": launcher, "threads": threads,
            "total": combine(per_step, launcher, threads), "null": interval95(null.pairs["cpu_cost"]),
            "wall": interval95(live.pairs["wall_cost"]), "agent_ms": scaled(agent, 1e3),
            "torchrun_ms": scaled(torchrun, 1e3), "step_ms": scaled(live.step_cpu(block), 1e3),
            "null_step_ms": scaled(null.step_cpu(block), 1e3)}
