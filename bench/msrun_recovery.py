"""Where a recovery's time goes under MindSpore's msrun: SIGKILL of rank 1 to every rank past a new step.

Real msrun with taskd's plugin (`MS_ENABLE_TFT='{RSC:1}'`) against a standalone `taskd server`, real
MindSpore data-parallel training (examples/mindspore/train_dp.py, MCCL AllReduce on CPU), one job per
run. The example's `--timeline DIR` gives each incarnation's own wall-clock milestones; the controller's
event history gives taskd's. Each phase ends at a milestone, taken as the last rank's (the job is past a
phase once every rank is); together they add up to the total:

- detection: kill -> the controller's `fault_reported` (the agent saw the exit and reported it);
- stop: -> the last `stop_complete`; strategy: -> `strategy_chosen` (globalFault, offers, choice);
- scheduler restart: -> the new msrun scheduler process created (the agent first stops every rank);
- rank process start: -> every new rank process created (START_ALL_WORKER);
- interpreter start: -> main() entered (python, numpy, taskd.worker loaded);
- `mindspore` import; communication init (`init()` returned: every rank registered with the scheduler);
- checkpoint load (the common-step AllReduce included);
- compile: the new incarnation's first step minus a steady step (PyNative's first-run op builds);
- first step: a steady step (the median step interval of the new incarnation, `--step-sleep` taken off).

Plain msrun (no `MS_ENABLE_TFT`) never resumes: its row is kill -> msrun's exit, and its code.

    python bench/msrun_recovery.py [--ranks 2 4] [--reps 1] [--env NAME=VALUE ...] [--label L] [--report]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    RESULTS,
    ROOT,
    JsonlTail,
    bench_env,
    free_port,
    header,
    job_events,
    start_controller,
    stop_process,
    table,
    wait_for,
    write_result,
)

TRAIN_DP = ROOT / "examples" / "mindspore" / "train_dp.py"
BIN = Path(sys.executable).parent
PHASES = [  # (name, the milestone it ends at)
    ("detection", "fault_reported"), ("stop", "stop_complete"), ("strategy", "strategy_chosen"),
    ("scheduler restart", "sched_created"), ("rank process start", "created"), ("interpreter start", "script"),
    ("mindspore import", "imported"), ("communication init", "init"), ("checkpoint load", "loaded"),
    ("compile", "compiled"), ("first step", "step"),
]
RESUMED_RE = re.compile(r"training resumed ([0-9.]+)s after the fault")


def msrun(n: int, work: Path, env: dict[str, str], args: argparse.Namespace) -> subprocess.Popen[bytes]:
    cmd = [str(BIN / "msrun"), "--worker_num", str(n), "--local_worker_num", str(n), "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "--log_dir", str(work / "logs"), "--join", "False", str(TRAIN_DP),
           "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--batch", str(8 * n),
           "--step-sleep", str(args.step_sleep), "--ckpt-dir", str(work / "ckpt"), "--out", str(work / "out"),
           "--timeline", str(work / "timeline")]
    out = (work / "msrun.out").open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)


def kill_rank_1(work: Path, proc: subprocess.Popen[bytes], args: argparse.Namespace) -> tuple[float, dict[int, int]]:
    """SIGKILL rank 1 once it is past `--kill-step`; (wall time of the kill, {rank: pid before the kill})."""
    tail = JsonlTail(work / "timeline" / "1.jsonl")
    def reached() -> Any:
        tail.poll()
        return proc.poll() is not None or next(
            (r for r in tail.records if r["what"] == "step" and r["step"] >= args.kill_step), None)

    rec = wait_for(reached, args.timeout, "rank 1 to reach the kill step", 0.01)
    if rec is True or proc.poll() is not None:
        raise RuntimeError(f"msrun exited {proc.returncode} before the kill:\n{(work / 'msrun.out').read_text()}")
    t_kill = time.time()
    os.kill(rec["pid"], signal.SIGKILL)
    before = {}
    for f in (work / "timeline").glob("[0-9]*.jsonl"):
        recs = [r for r in JsonlTail(f).poll() if r["t"] <= t_kill]
        if recs:
            before[int(f.stem)] = recs[-1]["pid"]
    return t_kill, before


def milestones(work: Path, n: int, t_kill: float, before: dict[int, int], step_sleep: float) -> dict[str, Any]:
    """The new incarnation's milestones, each the last rank's; the steady step from its step marks."""
    found: dict[str, float] = {}
    steady: list[float] = []
    for rank in range(n):
        recs = [r for r in JsonlTail(work / "timeline" / f"{rank}.jsonl").poll()
                if r["pid"] != before.get(rank) and r["t"] >= t_kill - 1.0]
        if not recs:
            raise RuntimeError(f"rank {rank} has no new incarnation in its timeline")
        pid = recs[0]["pid"]
        mine = [r for r in recs if r["pid"] == pid]
        for what in ("created", "script", "imported", "init", "loaded", "step"):
            t = next((r["t"] for r in mine if r["what"] == what and r["t"] is not None), None)
            if t is not None:
                found[what] = max(found.get(what, t), t)
        steps = [r["t"] for r in mine if r["what"] == "step"]
        steady += [b - a - step_sleep for a, b in zip(steps[1:], steps[2:], strict=False)]  # past the first (compile) step
    sched = [r for r in JsonlTail(work / "timeline" / "sched.jsonl").poll() if r["what"] == "created"
             and r["t"] is not None and r["t"] >= t_kill - 0.05]
    if sched:
        found["sched_created"] = sched[0]["t"]
    step = statistics.median(steady) if steady else 0.0
    if "step" in found:
        found["compiled"] = found["step"] - step
    return {"at": found, "steady_step": step}


def controller_milestones(events: list[dict[str, Any]], t_kill: float) -> dict[str, float]:
    """taskd's milestones of the round the kill opened: the first fault report, its last stop, the choice."""
    after = [e for e in events if e["time"] >= t_kill - 0.05]
    first = next((e for e in after if e["kind"] == "fault_reported"), None)
    if first is None:
        return {}
    rnd = first["round"]
    found = {"fault_reported": first["time"]}
    for kind, pick in (("stop_complete", max), ("strategy_chosen", min), ("recover_status", max)):
        times = [e["time"] for e in after if e["kind"] == kind and e["round"] == rnd]
        if times:
            found[kind] = pick(times)
    chosen = next((e for e in after if e["kind"] == "strategy_chosen" and e["round"] == rnd), None)
    found["strategy"] = chosen["detail"].get("strategy") if chosen else None  # type: ignore[assignment]
    return found


def run_taskd(n: int, args: argparse.Namespace, extra_env: dict[str, str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"msrun-recovery-{n}-"))
    port = free_port()
    ctl = start_controller(port, log=work / "controller.log")
    job = f"msrun-bench-{uuid.uuid4().hex[:8]}"
    env = bench_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", MS_ENABLE_TFT="{RSC:1}",
                    MINDX_TASK_ID=job, MINDX_SERVER_IP=f"127.0.0.1:{port}", GLOG_v="2", TASKD_MAX_RESTARTS="3",
                    TASKD_HEARTBEAT_TIMEOUT="120", **extra_env)  # heartbeats let the agent see training resume
    proc = msrun(n, work, env, args)
    try:
        t_kill, before = kill_rank_1(work, proc, args)
        code = proc.wait(args.timeout)
        t_exit = time.time()
        events = job_events(f"127.0.0.1:{port}", job)
    finally:
        stop_process(proc)
        stop_process(ctl)
    ms = milestones(work, n, t_kill, before, args.step_sleep)
    at = {**controller_milestones(events, t_kill), **ms["at"]}
    console = (work / "logs" / "taskd_agent.log").read_text(errors="replace") \
        if (work / "logs" / "taskd_agent.log").exists() else (work / "msrun.out").read_text(errors="replace")
    said = [float(x) for x in RESUMED_RE.findall(console)]
    phases, prev = {}, t_kill
    for name, milestone in PHASES:
        if isinstance(at.get(milestone), float):
            phases[name] = at[milestone] - prev
            prev = at[milestone]
        else:
            phases[name] = None
    return {"ranks": n, "taskd": True, "exit_code": code, "exit_after": t_exit - t_kill, "strategy": at.get("strategy"),
            "phases": phases, "total": (at["step"] - t_kill) if "step" in at else None,
            "restart_reported_after": (at["recover_status"] - t_kill) if "recover_status" in at else None,
            "steady_step": ms["steady_step"], "agent_says_resumed_after": said[0] if said else None,
            "work": str(work), "env": extra_env}


def run_plain(n: int, args: argparse.Namespace, extra_env: dict[str, str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"msrun-plain-{n}-"))
    env = bench_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", GLOG_v="2", **extra_env)
    env.pop("MS_ENABLE_TFT", None)
    proc = msrun(n, work, env, args)
    try:
        t_kill, _ = kill_rank_1(work, proc, args)
        code = proc.wait(args.timeout)
        t_exit = time.time()
    finally:
        stop_process(proc)
    return {"ranks": n, "taskd": False, "exit_code": code, "exit_after": t_exit - t_kill, "work": str(work),
            "env": extra_env}


def report(runs: list[dict[str, Any]]) -> str:
    """Phases as rows, one column per run (taskd n ranks, then plain msrun's exit)."""
    cols = sorted(runs, key=lambda r: (r["ranks"], not r["taskd"]))
    heads = ["phase (s)"] + [f"{'taskd' if r['taskd'] else 'plain msrun'} {r['ranks']} ranks" for r in cols]
    rows = [[name] + [r["phases"].get(name) if r["taskd"] else None for r in cols] for name, _ in PHASES]
    rows.append(["**kill -> every rank past a new step**"] + [r["total"] if r["taskd"] else None for r in cols])
    rows.append(["agent's \"training resumed ... after the fault\""]
                + [r.get("agent_says_resumed_after") for r in cols])
    rows.append(["kill -> msrun exit (exit code)"] + [f"{r['exit_after']:.2f} ({r['exit_code']})" for r in cols])
    rows.append(["strategy"] + [r.get("strategy") or "none (no recovery)" for r in cols])
    return table(heads, rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=1, help="taskd runs per size (plain msrun: one)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--kill-step", type=int, default=13, help="rank 1 is killed once it completed this step")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds each msrun may take")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for every run (repeatable)")
    p.add_argument("--label", default="", help="results go to msrun_recovery[_LABEL]_<n>.json")
    p.add_argument("--no-plain", action="store_true", help="skip the plain msrun runs")
    p.add_argument("--report", action="store_true", help="only print the table of the saved results")
    args = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.env)
    name = "msrun_recovery" + (f"_{args.label}" if args.label else "")
    if not args.report:
        for n in args.ranks:
            result = header(name, args)
            runs = [run_taskd(n, args, extra) for _ in range(args.reps)]
            if not args.no_plain:
                runs.append(run_plain(n, args, extra))
            result["runs"] = runs
            write_result(f"{name}_{n}", result)
            print(report(runs))
    saved = []
    for n in args.ranks:
        path = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS) / f"{name}_{n}.json"
        if path.exists():
            saved += json.loads(path.read_text())["runs"]
    print(f"\n{name}: kill of rank 1 at step {args.kill_step} -> every rank past a new step\n")
    print(report(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
