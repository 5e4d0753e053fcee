"""Detection latency: SIGKILL of a rank to the agent noticing it and to the controller receiving the fault.

taskd: the killer takes `time.time()` just before `os.kill(pid, SIGKILL)`; the agent's "fault: rank R
(pid P) ..." log record (its `created` time, written as JSON by bench/run_taskd.py) is when the agent
noticed; the controller's `fault_reported` event (its event history, `ListJobs`) is when
ReportProcessFault was handled. A standalone controller (`python -m taskd.controller`, settle window
0) is used so that every kill is recovered with `recover` and the next kill can follow.

The floor is measured in the same run: the same dummy rank SIGKILLed with only a bare pidfd selector
watching it (no agent), i.e. how long the kernel takes to tear a Python process down.

torchrun (`python -m torch.distributed.run --standalone`, default monitor interval): the moment its agent
acts on the failure is its "[default] Worker group FAILED ..." log record (LOGLEVEL=INFO, timestamped
by bench/run_torchrun.py); the moment the surviving rank receives SIGTERM is recorded too.

    python bench/detection.py [--quick] [--kills 200] [--torch-kills 200]
"""

from __future__ import annotations

import argparse
import os
import re
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
    ranks_alive,
    ratio,
    start_controller,
    stats,
    stop_process,
    table,
    torch_missing_message,
    wait_for,
    write_result,
)

PID_RE = re.compile(r"pid (\d+)")


def current_pids(ranks: JsonlTail, nproc: int, after: float = 0.0) -> dict[int, int]:
    ranks.poll()
    latest: dict[int, dict[str, Any]] = {}
    for rec in ranks.records:
        if rec["event"] == "start" and rec["t"] >= after:
            latest[rec["rank"]] = rec
    return {r: rec["pid"] for r, rec in latest.items()} if len(latest) == nproc else {}


def run_taskd(kills: int, nproc: int, work: Path) -> dict[str, Any]:
    port = free_port()
    address = f"127.0.0.1:{port}"
    job = f"bench-detect-{os.getpid()}"
    controller = start_controller(port, log=work / "controller.log",
                                  extra=["--settle-window", "0", "--max-restarts", "10000"])
    events, ranks = work / "taskd-events.jsonl", work / "taskd-ranks.jsonl"
    cmd = [sys.executable, str(TASKD_DRIVER), "--server", address, "--job-id", job, "--nproc-per-node", str(nproc),
           "--max-restarts", "10000", "--strategies", "recover,exit", "--stop-grace", "1", "--quiet",
           str(RANK_DUMMY)]
    agent = subprocess.Popen(cmd, env=bench_env(BENCH_EVENTS=str(events), BENCH_RANK_LOG=str(ranks)),
                             stdout=(work / "taskd-console.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    ev, rk = JsonlTail(events), JsonlTail(ranks)
    kills_done: list[dict[str, Any]] = []
    collector = EventCollector(address, job)
    try:
        wait_for(lambda: current_pids(rk, nproc), 60, "every rank started")
        for i in range(kills):
            victim = i % nproc
            pid = current_pids(rk, nproc)[victim]
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            rec = ev.find(lambda r, p=pid: r["msg"].startswith("fault: ") and f"(pid {p})" in r["msg"], 30,
                          f"the agent's fault record of pid {pid}")
            ev.find(lambda r, t=t_kill: r["msg"].startswith("replaced rank") and r["t"] >= t, 60,
                    f"recovery after kill {i}")
            wait_for(lambda v=victim, t=t_kill: rk.poll() is not None and ranks_alive(rk.records, [v], t), 60,
                     "the replacement rank's start")
            kills_done.append({"pid": pid, "rank": victim, "t_kill": t_kill, "t_agent": rec["t"]})
            if i % 10 == 9:
                collector.fetch()  # the controller answers only its last 500 events
        history = collector.fetch()
    finally:
        stop_process(agent)
        stop_process(controller)
    by_pid = {}
    for e in history:
        if e["kind"] == "fault_reported":
            m = PID_RE.search(e["detail"].get("detail", ""))
            if m:
                by_pid.setdefault(int(m.group(1)), e["time"])
    for k in kills_done:
        k["t_controller"] = by_pid.get(k["pid"])
    agent_lat = [k["t_agent"] - k["t_kill"] for k in kills_done]
    ctrl_lat = [k["t_controller"] - k["t_kill"] for k in kills_done if k["t_controller"] is not None]
    return {"kills": kills_done, "agent_ms": stats(agent_lat, 1e3), "controller_ms": stats(ctrl_lat, 1e3),
            "agent_ms_all": [round(x * 1e3, 3) for x in agent_lat],
            "controller_ms_all": [round(x * 1e3, 3) for x in ctrl_lat],
            "controller_missing": sum(1 for k in kills_done if k["t_controller"] is None)}


def _terms(rk: JsonlTail, pids: list[int]) -> list[float] | None:
    rk.poll()
    got = [r["t"] for r in rk.records if r["event"] == "term" and r["pid"] in pids]
    return got if len(got) == len(pids) else None


def run_torchrun(kills: int, nproc: int, work: Path) -> dict[str, Any]:
    events, ranks = work / "torch-events.jsonl", work / "torch-ranks.jsonl"
    cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", str(kills + 1), str(RANK_DUMMY)]
    agent = subprocess.Popen(cmd, env=bench_env(BENCH_EVENTS=str(events), BENCH_RANK_LOG=str(ranks)),
                             stdout=(work / "torch-console.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    ev, rk = JsonlTail(events), JsonlTail(ranks)
    done: list[dict[str, Any]] = []

    def generation(n: int) -> dict[int, int]:
        rk.poll()
        found = {r["rank"]: r["pid"] for r in rk.records if r["event"] == "start" and r["restart"] == n}
        return found if len(found) == nproc else {}

    try:
        for i in range(kills):
            pids = wait_for(lambda n=i: generation(n), 120, f"torchrun generation {i}")
            time.sleep(0.05)  # let the monitor loop settle into its sleep, as in a running job
            victim = i % nproc
            t_kill = time.time()
            os.kill(pids[victim], signal.SIGKILL)
            rec = ev.find(lambda r, t=t_kill: "Worker group FAILED" in r["msg"] and r["t"] >= t, 60,
                          "torchrun's failure record")
            others = [p for r, p in pids.items() if r != victim]
            terms = wait_for(lambda o=others: _terms(rk, o), 60, "SIGTERM of the surviving ranks")
            done.append({"victim_pid": pids[victim], "t_kill": t_kill, "t_agent": rec["t"], "t_term": max(terms)})
    finally:
        stop_process(agent)
    return {"kills": done, "agent_ms": stats([d["t_agent"] - d["t_kill"] for d in done], 1e3),
            "term_ms": stats([d["t_term"] - d["t_kill"] for d in done], 1e3),
            "acts_ms_all": [round((min(d["t_agent"], d["t_term"]) - d["t_kill"]) * 1e3, 3) for d in done],
            "acts_ms": stats([min(d["t_agent"], d["t_term"]) - d["t_kill"] for d in done], 1e3)}


def run_floor(kills: int) -> dict[str, Any]:
    """The kernel's part, measured in the same run: SIGKILL of the same dummy rank to its pidfd being
    readable, with nothing but a bare selector watching. A Python process takes about a millisecond
    to be torn down, so no agent can notice its death sooner than this."""
    import selectors

    lat = []
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, "-u", str(RANK_DUMMY)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env={**os.environ, "BENCH_RANK_LOG": ""})
        proc.stdout.readline()  # it is up and idle, like a rank about to be killed
        fd = os.pidfd_open(proc.pid)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            t_kill = time.time()
            os.kill(proc.pid, signal.SIGKILL)
            sel.select(10)
            lat.append(time.time() - t_kill)
        os.close(fd)
        proc.wait(10)  # SIGKILLed above: reaped at once
        proc.stdout.close()
    return {"pidfd_ms": stats(lat, 1e3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny run (a few kills) to check the script works")
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--torch-kills", type=int, default=None, help="default: --kills")
    p.add_argument("--nproc", type=int, default=2, help="ranks per job (the victim alternates)")
    args = p.parse_args()
    if args.quick:
        args.kills, args.torch_kills = 6, 3
    torch_kills = args.torch_kills if args.torch_kills is not None else args.kills
    result = header("detection", args)
    result.update({"kills": args.kills, "torch_kills": torch_kills, "nproc": args.nproc})
    with tempfile.TemporaryDirectory(prefix="taskd-bench-detect-") as tmp:
        work = Path(tmp)
        t = run_taskd(args.kills, args.nproc, work)
        result["taskd"] = {k: v for k, v in t.items() if k != "kills"}
        result["floor"] = run_floor(args.kills)
        if has_torch():
            result["torchrun"] = {k: v for k, v in run_torchrun(torch_kills, args.nproc, work).items() if k != "kills"}
        else:
            print(torch_missing_message())
            result["torchrun"] = None
    rows = [["floor: pidfd readable, bare watcher (kernel teardown)", *_row(result["floor"]["pidfd_ms"])],
            ["taskd agent notices (fault: log record)", *_row(result["taskd"]["agent_ms"])],
            ["taskd controller receives ReportProcessFault", *_row(result["taskd"]["controller_ms"])]]
    tr = result["torchrun"]
    if tr:
        rows += [["torchrun agent acts (Worker group FAILED)", *_row(tr["agent_ms"])],
                 ["torchrun surviving rank gets SIGTERM", *_row(tr["term_ms"])],
                 ["torchrun acts (earlier of the two)", *_row(tr["acts_ms"])]]
        result["ratios"] = {
            "torchrun_agent_over_taskd_agent_p50": ratio(tr["acts_ms"]["p50"], result["taskd"]["agent_ms"]["p50"]),
            "torchrun_agent_over_taskd_agent_p99": ratio(tr["acts_ms"]["p99"], result["taskd"]["agent_ms"]["p99"]),
            "torchrun_agent_over_taskd_controller_p99": ratio(tr["acts_ms"]["p99"],
                                                              result["taskd"]["controller_ms"]["p99"]),
        }
    print(f"Detection latency, SIGKILL of a rank to ... (ms; {args.kills} kills taskd, "
          f"{torch_kills if tr else 0} torchrun, {args.nproc} ranks)")
    print(table(["measurement", "n", "p50 ms", "p99 ms", "max ms", "mean ms"], rows, 3))
    if tr:
        r = result["ratios"]
        print(f"\nratio torchrun/taskd (agent): p50 {r['torchrun_agent_over_taskd_agent_p50']:.0f}x, "
              f"p99 {r['torchrun_agent_over_taskd_agent_p99']:.0f}x")
    write_result("detection", result)
    return 0


def _row(s: dict[str, Any]) -> list[Any]:
    return [s["n"], s["p50"], s["p99"], s["max"], s["mean"]]


if __name__ == "__main__":
    sys.exit(main())
