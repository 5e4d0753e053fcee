"""Supervision overhead: CPU seconds per minute of the agent process while 8 idle ranks sleep.

Measures the agent process alone (its threads' schedstat run time, children excluded) over a window
after a warm-up: `taskd run` (embedded controller in the same process, default --monitor-interval 1)
and torchrun (`--standalone`, default --monitor-interval 0.1). Also prints the worker SDK's per-call
costs (`python -m taskd.worker.bench`): heartbeat() is meant to be called every training step.

    python bench/overhead.py [--quick] [--ranks 8] [--window 60]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import (
    RANK_DUMMY,
    ROOT,
    JsonlTail,
    bench_env,
    has_torch,
    header,
    ratio,
    stop_process,
    table,
    torch_missing_message,
    wait_for,
    write_result,
)


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU time of the process's live threads from /proc/<pid>/task/*/schedstat (nanoseconds).

    psutil's cpu_times counts clock ticks (10 ms): an idle agent uses a handful per minute, so the
    figure would move by 10 % from one tick. Falls back to cpu_times where schedstat is missing.
    """
    total = 0
    try:
        for tid in Path(f"/proc/{proc.pid}/task").iterdir():
            try:
                total += int((tid / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    except OSError:
        total = 0
    if total:
        return total / 1e9
    t = proc.cpu_times()
    return t.user + t.system


def measure(cmd: list[str], ranks: int, warmup: float, window: float, work: Path, tag: str) -> dict[str, Any]:
    rank_log = work / f"{tag}-ranks.jsonl"
    proc = subprocess.Popen(cmd, env=bench_env(BENCH_RANK_LOG=str(rank_log)), stdout=(work / f"{tag}.log").open("wb"),
                            stderr=subprocess.STDOUT, cwd=ROOT)
    rk = JsonlTail(rank_log)
    try:
        wait_for(lambda: rk.poll() is not None and len({r["rank"] for r in rk.records}) == ranks, 120,
                 f"{tag}: every rank started", 0.05)
        time.sleep(warmup)
        p = psutil.Process(proc.pid)
        c0, t0 = cpu_seconds(p), time.monotonic()
        time.sleep(window)
        c1, t1 = cpu_seconds(p), time.monotonic()
        threads = p.num_threads()
        rss = p.memory_info().rss
    finally:
        stop_process(proc)
    return {"cpu_s": c1 - c0, "wall_s": t1 - t0, "cpu_s_per_min": (c1 - c0) / (t1 - t0) * 60, "threads": threads,
            "rss_mib": rss / 2**20}


def worker_sdk_costs(calls: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "taskd.worker.bench", "--calls", str(calls)], capture_output=True,
                         text=True, env=bench_env(), cwd=ROOT, timeout=120)
    costs = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(.+): ([0-9.]+) us/call", line)
        if m:
            costs[m.group(1)] = float(m.group(2))
    return costs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short window to check the script works")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--window", type=float, default=60.0, help="seconds measured")
    p.add_argument("--warmup", type=float, default=3.0)
    args = p.parse_args()
    calls = 200_000
    if args.quick:
        args.window, args.warmup, calls = 3.0, 0.5, 20_000
    result = header("overhead", args)
    result.update({"ranks": args.ranks, "window_s": args.window})
    with tempfile.TemporaryDirectory(prefix="taskd-bench-overhead-") as tmp:
        work = Path(tmp)
        taskd_cmd = [sys.executable, "-m", "taskd.run", "--nproc-per-node", str(args.ranks), "--quiet",
                     str(RANK_DUMMY)]
        result["taskd"] = measure(taskd_cmd, args.ranks, args.warmup, args.window, work, "taskd")
        if has_torch():
            torch_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                         str(args.ranks), str(RANK_DUMMY)]
            result["torchrun"] = measure(torch_cmd, args.ranks, args.warmup, args.window, work, "torchrun")
        else:
            print(torch_missing_message())
            result["torchrun"] = None
    result["worker_sdk_us_per_call"] = worker_sdk_costs(calls)
    tr = result["torchrun"]
    result["taskd_over_torchrun"] = ratio(result["taskd"]["cpu_s_per_min"], tr["cpu_s_per_min"]) if tr else None
    rows = [["taskd run (agent + embedded controller)", *_row(result["taskd"])]]
    if tr:
        rows.append(["torchrun (agent + c10d store)", *_row(tr)])
    print(f"Supervision overhead: agent process CPU while {args.ranks} idle ranks sleep ({args.window:.0f} s window)")
    print(table(["agent", "CPU s/min", "CPU s", "wall s", "threads", "RSS MiB"], rows, 3))
    if tr:
        r = result["taskd_over_torchrun"]
        # a short window can measure 0 CPU seconds for torchrun (psutil's 10 ms resolution): no ratio then
        print(f"\ntaskd / torchrun CPU: {r:.2f}" if r is not None else "\ntaskd / torchrun CPU: n/a (window too short)")
    print("\nworker SDK cost per call (python -m taskd.worker.bench)")
    print(table(["call", "us/call"], [[k, v] for k, v in result["worker_sdk_us_per_call"].items()], 3))
    write_result("overhead", result)
    return 0


def _row(m: dict[str, Any]) -> list[Any]:
    return [m["cpu_s_per_min"], m["cpu_s"], m["wall_s"], m["threads"], m["rss_mib"]]


if __name__ == "__main__":
    sys.exit(main())
