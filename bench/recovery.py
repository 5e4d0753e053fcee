"""Time to recover: SIGKILL of one rank to the replacement running, for taskd and torchrun.

taskd (`taskd run --server`, a standalone controller with settle window 0, one job per configuration):
- "replacement running" is the agent's "replaced rank(s) ..." log record, written right after
  START_WORKER_LIST / START_ALL_WORKER returned with the new process(es) spawned;
- "first line" is the replacement's own first statement (bench/rank_dummy.py records `time.time()`
  before it prints); for job-rescheduling, the last of every rank's first line;
- phases come from the controller's event history: detect (kill to `fault_reported`), stop (to the
  last `stop_complete`), decide (to `strategy_chosen`: globalFault, strategies, choice), restart (to
  the last `recover_status`: the agents restart ranks and report).

torchrun (`--standalone --max-restarts N`, default monitor interval): kill to every replacement rank's
first line (torchrun always restarts the whole worker group).

    python bench/recovery.py [--quick] [--sizes 4,8] [--reps 20] [--torch-reps 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    RANK_DUMMY,
    ROOT,
    TASKD_DRIVER,
    TORCHRUN_DRIVER,
    EventCollector,
    JsonlTail,
    bench_env,
    free_port,
    has_torch,
    header,
    ratio,
    start_controller,
    stats,
    stop_process,
    table,
    torch_missing_message,
    wait_for,
    write_result,
)


def starts_after(rk: JsonlTail, t: float, ranks: list[int]) -> dict[int, dict[str, Any]] | None:
    rk.poll()
    found: dict[int, dict[str, Any]] = {}
    for rec in rk.records:
        if rec["event"] == "start" and rec["t"] >= t and rec["rank"] in ranks and rec["rank"] not in found:
            found[rec["rank"]] = rec
    return found if len(found) == len(ranks) else None


# (row label, strategy, warm spares): `recover` with a warm spare skips the replacement's interpreter start
# (spares -1 = one per rank)
CONFIGS = (("recover", "recover", 0), ("recover + warm spare", "recover", 1),
           ("job-rescheduling", "job-rescheduling", 0), ("job-rescheduling + warm spares", "job-rescheduling", -1))


def latest_pids(rk: JsonlTail, nproc: int) -> dict[int, int] | None:
    rk.poll()
    latest = {r["rank"]: r["pid"] for r in rk.records if r["event"] == "start"}
    return latest if len(latest) == nproc else None


def run_taskd(address: str, nproc: int, strategy: str, reps: int, work: Path, spares: int = 0) -> dict[str, Any]:
    job = f"bench-recover-{strategy}-{nproc}-{spares}-{os.getpid()}"
    tag = f"taskd-{strategy}-{nproc}-{spares}"
    events, ranks = work / f"{tag}-events.jsonl", work / f"{tag}-ranks.jsonl"
    cmd = [sys.executable, str(TASKD_DRIVER), "--server", address, "--job-id", job, "--nproc-per-node", str(nproc),
           "--max-restarts", "10000", "--strategies", f"{strategy},exit", "--warm-spares", str(spares), "--quiet",
           str(RANK_DUMMY)]
    agent = subprocess.Popen(cmd, env=bench_env(BENCH_EVENTS=str(events), BENCH_RANK_LOG=str(ranks)),
                             stdout=(work / f"{tag}-console.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    ev, rk = JsonlTail(events), JsonlTail(ranks)
    kills: list[dict[str, Any]] = []
    everyone = list(range(nproc))
    collector = EventCollector(address, job)
    try:
        wait_for(lambda: latest_pids(rk, nproc), 60, "every rank started")
        for i in range(reps):
            victim = i % nproc
            time.sleep(0.2)  # a running job, not one still settling from the last recovery
            pid = latest_pids(rk, nproc)[victim]
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            rec = ev.find(lambda r, t=t_kill: r["msg"].startswith("replaced rank") and r["t"] >= t, 60,
                          f"recovery after kill {i}")
            replaced = [victim] if strategy == "recover" else everyone
            starts = wait_for(lambda t=t_kill, rs=replaced: starts_after(rk, t, rs), 60, "the replacements' start")
            kills.append({"t_kill": t_kill, "pid": pid, "t_running": rec["t"],
                          "t_first_line": max(s["t"] for s in starts.values())})
            if i % 10 == 9:
                collector.fetch()  # the controller answers only its last 500 events
        history = collector.fetch()
    finally:
        stop_process(agent)
    phases = _phases(history, kills)
    return {
        "kill_to_running_ms": stats([k["t_running"] - k["t_kill"] for k in kills], 1e3),
        "kill_to_first_line_ms": stats([k["t_first_line"] - k["t_kill"] for k in kills], 1e3),
        "phases_ms": {name: stats(vals, 1e3) for name, vals in phases.items()},
    }


def _phases(history: list[dict[str, Any]], kills: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per round (round n = kill n-1): detect, stop, decide, restart from the event history."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for e in history:
        by_round.setdefault(e["round"], []).append(e)
    out: dict[str, list[float]] = {"detect": [], "stop": [], "decide": [], "restart": []}
    for n, kill in enumerate(kills, start=1):
        evs = by_round.get(n, [])
        t = {k: [e["time"] for e in evs if e["kind"] == k] for k in
             ("fault_reported", "stop_complete", "strategy_chosen", "recover_status")}
        if not all(t.values()):
            continue
        fault, stop, chosen, status = min(t["fault_reported"]), max(t["stop_complete"]), min(
            t["strategy_chosen"]), max(t["recover_status"])
        out["detect"].append(fault - kill["t_kill"])
        out["stop"].append(stop - fault)
        out["decide"].append(chosen - stop)
        out["restart"].append(status - chosen)
    return out


def run_torchrun(nproc: int, reps: int, work: Path) -> dict[str, Any]:
    tag = f"torch-{nproc}"
    events, ranks = work / f"{tag}-events.jsonl", work / f"{tag}-ranks.jsonl"
    cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(reps + 1), str(RANK_DUMMY)]
    agent = subprocess.Popen(cmd, env=bench_env(BENCH_EVENTS=str(events), BENCH_RANK_LOG=str(ranks)),
                             stdout=(work / f"{tag}-console.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    rk = JsonlTail(ranks)
    lat: list[float] = []

    def generation(n: int) -> dict[int, dict[str, Any]] | None:
        rk.poll()
        found = {r["rank"]: r for r in rk.records if r["event"] == "start" and r["restart"] == n}
        return found if len(found) == nproc else None

    try:
        gen = wait_for(lambda: generation(0), 120, "torchrun's first generation")
        for i in range(reps):
            time.sleep(0.2)
            t_kill = time.time()
            os.kill(gen[i % nproc]["pid"], signal.SIGKILL)
            gen = wait_for(lambda n=i + 1: generation(n), 120, f"torchrun generation {i + 1}")
            lat.append(max(r["t"] for r in gen.values()) - t_kill)
    finally:
        stop_process(agent)
    return {"kill_to_all_first_lines_ms": stats(lat, 1e3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    p.add_argument("--sizes", default="4,8", help="ranks per job, comma-separated")
    p.add_argument("--reps", type=int, default=20, help="kills per taskd configuration")
    p.add_argument("--torch-reps", type=int, default=10, help="kills per torchrun configuration")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        sizes, args.reps, args.torch_reps = [4], 2, 1
    result = header("recovery", args)
    result.update({"sizes": sizes, "reps": args.reps, "torch_reps": args.torch_reps, "taskd": {}, "torchrun": {}})
    use_torch = has_torch()
    if not use_torch:
        print(torch_missing_message())
    with tempfile.TemporaryDirectory(prefix="taskd-bench-recover-") as tmp:
        work = Path(tmp)
        port = free_port()
        controller = start_controller(port, log=work / "controller.log",
                                      extra=["--settle-window", "0", "--max-restarts", "10000"])
        try:
            for n in sizes:
                for label, strategy, spares in CONFIGS:
                    result["taskd"][f"{label}/{n}"] = run_taskd(f"127.0.0.1:{port}", n, strategy, args.reps, work,
                                                                 n if spares < 0 else spares)
        finally:
            stop_process(controller)
        for n in sizes:
            result["torchrun"][str(n)] = run_torchrun(n, args.torch_reps, work) if use_torch else None
    rows, phase_rows, ratios = [], [], {}
    for n in sizes:
        tr = result["torchrun"].get(str(n))
        tr_p50 = tr["kill_to_all_first_lines_ms"]["p50"] if tr else None
        for label, _, _ in CONFIGS:
            r = result["taskd"][f"{label}/{n}"]
            run, first = r["kill_to_running_ms"], r["kill_to_first_line_ms"]
            ratios[f"{label}/{n}"] = ratio(tr_p50, first["p50"])
            rows.append([f"taskd {label}", n, run["n"], run["p50"], run["p99"], first["p50"], first["p99"],
                         ratios[f"{label}/{n}"]])
            ph = r["phases_ms"]
            phase_rows.append([label, n, *(ph[k]["p50"] for k in ("detect", "stop", "decide", "restart"))])
        if tr:
            s = tr["kill_to_all_first_lines_ms"]
            rows.append(["torchrun (whole group)", n, s["n"], None, None, s["p50"], s["p99"], 1.0])
    result["ratios_torchrun_over_taskd_first_line_p50"] = ratios
    print("Time to recover, SIGKILL of one rank to ... (ms)")
    print(table(["launcher / strategy", "ranks", "kills", "running p50", "running p99", "first line p50",
                 "first line p99", "torchrun/this (p50)"], rows, 1))
    print("\ntaskd phases from the controller's event history (p50, ms)")
    print(table(["strategy", "ranks", "detect", "stop", "decide", "restart"], phase_rows, 1))
    write_result("recovery", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
