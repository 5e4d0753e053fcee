"""Work lost: steps recomputed after a fault, against the checkpoint interval K.

Runs examples/train_resumable.py under `taskd run` (4 ranks, embedded controller), SIGKILLs rank 1 at a
random moment after its first checkpoint, lets taskd recover it, and reads what the example records:
``rank<R>.computed`` counts every step computed including recomputed ones, so steps recomputed =
computed - steps. With `recover` only the killed rank recomputes; with `job-rescheduling` every rank
goes back to its last checkpoint.

    python bench/work_lost.py [--quick] [--ks 5,10,20] [--reps 3] [--strategies recover,job-rescheduling]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, bench_env, header, rank_pids, stats, table, wait_for, write_result

EXAMPLE = ROOT / "examples" / "train_resumable.py"
NPROC = 4
VICTIM = 1


def one_run(k: int, strategy: str, steps: int, step_sleep: float, work: Path, seed: int) -> dict[str, Any]:
    ckpt, out = work / "ckpt", work / "out"
    cmd = [sys.executable, "-m", "taskd.run", "--nproc-per-node", str(NPROC), "--strategies", f"{strategy},exit",
           "--quiet", str(EXAMPLE), "--steps", str(steps), "--ckpt-every", str(k), "--ckpt-dir", str(ckpt),
           "--out", str(out), "--step-sleep", str(step_sleep)]
    proc = subprocess.Popen(cmd, env=bench_env(), stdout=(work / "console.log").open("wb"),
                            stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        counter = out / f"rank{VICTIM}.computed"
        dirs = [ckpt / f"rank{r}" for r in range(NPROC)]
        # every rank past its first checkpoint, so every rank has declared it can rejoin (a rank still starting
        # has not, and then `recover` is rightly not offered: a loaded machine once killed rank 1 that early)
        wait_for(lambda: all(d.is_dir() and any(d.iterdir()) for d in dirs), 60, "every rank's first checkpoint",
                 0.01)
        pids = wait_for(lambda: (r := rank_pids(proc.pid)) and len(r) == NPROC and r, 30, "every rank running")
        time.sleep(random.Random(seed).uniform(0, 2 * k * step_sleep))
        os.kill(pids[VICTIM], signal.SIGKILL)
        at_kill = counter.stat().st_size
        code = proc.wait(timeout=60 + steps * step_sleep * 3)
    except subprocess.TimeoutExpired:
        tail = (work / "console.log").read_text()[-3000:]
        raise RuntimeError(f"taskd run did not finish; console tail:\n{tail}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if code != 0:
        raise RuntimeError(f"taskd run exited {code}: {(work / 'console.log').read_text()[-2000:]}")
    summaries = [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)]
    recomputed = [s["computed"] - steps for s in summaries]
    return {"k": k, "strategy": strategy, "step_at_kill": at_kill,
            "victim_resumed_from": summaries[VICTIM]["resumed_from"],
            "victim_recomputed": recomputed[VICTIM], "all_ranks_recomputed": sum(recomputed)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    p.add_argument("--ks", default="5,10,20", help="checkpoint intervals K")
    p.add_argument("--reps", type=int, default=3, help="faults per (K, strategy)")
    p.add_argument("--strategies", default="recover,job-rescheduling")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--step-sleep", type=float, default=0.02, help="seconds per step")
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",") if k]
    strategies = [s for s in args.strategies.split(",") if s]
    if args.quick:
        ks, args.reps, strategies, args.steps = [5], 1, ["recover"], 60
    result = header("work_lost", args)
    result.update({"ks": ks, "reps": args.reps, "strategies": strategies, "steps": args.steps,
                   "step_sleep": args.step_sleep, "ranks": NPROC, "runs": []})
    for strategy in strategies:
        for k in ks:
            for rep in range(args.reps):
                with tempfile.TemporaryDirectory(prefix="taskd-bench-work-") as tmp:
                    result["runs"].append(one_run(k, strategy, args.steps, args.step_sleep, Path(tmp),
                                                  seed=hash((k, rep, strategy)) & 0xFFFF))
    rows, summary = [], {}
    for strategy in strategies:
        for k in ks:
            runs = [r for r in result["runs"] if r["k"] == k and r["strategy"] == strategy]
            v = stats([r["victim_recomputed"] for r in runs])
            a = stats([r["all_ranks_recomputed"] for r in runs])
            summary[f"{strategy}/{k}"] = {"victim_recomputed": v, "all_ranks_recomputed": a,
                                          "within_k": all(0 <= r["victim_recomputed"] <= k for r in runs)}
            within = summary[f"{strategy}/{k}"]["within_k"]
            rows.append([strategy, k, len(runs), v["mean"], v["max"], a["mean"], within])
    result["summary"] = summary
    print(f"Work lost: steps recomputed after one SIGKILL of rank {VICTIM} ({NPROC} ranks, checkpoint every K steps)")
    print(table(["strategy", "K", "faults", "killed rank mean", "killed rank max", "all ranks mean", "always <= K"],
                rows, 1))
    write_result("work_lost", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
