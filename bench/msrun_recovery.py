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
`--fault hang` SIGSTOPs rank 1 instead (`TASKD_HEARTBEAT_TIMEOUT` 5 s): every time then counts from its
last step, as taskd's "training resumed ... after the fault" does for a hang, and detection includes
the heartbeat timeout. Plain msrun never notices a stopped rank: run it with `--no-plain`.

    python bench/msrun_recovery.py [--quick] [--ranks 2 4] [--reps 1] [--fault kill|hang] [--env NAME=VALUE ...]
                                   [--label L] [--no-plain | --no-taskd] [--report]
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

import psutil
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
           "--master_port", str(free_port()), "--log_dir", str(work / "logs"),
           "--join", "False" if "MS_ENABLE_TFT" in env else "True",  # plain msrun waits for its ranks only so
           str(TRAIN_DP),
           "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--batch", str(8 * n),
           "--step-sleep", str(args.step_sleep), "--ckpt-dir", str(work / "ckpt"), "--out", str(work / "out"),
           "--timeline", str(work / "timeline")]
    out = (work / "msrun.out").open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)


def kill_rank_1(work: Path, proc: subprocess.Popen[bytes], args: argparse.Namespace) -> tuple[float, dict[int, int]]:
    """SIGKILL (or, `--fault hang`, SIGSTOP) rank 1 once it is past `--kill-step`; (wall time of the fault,
    {rank: pid before it}). A hang's time is its last step, not the stop: taskd counts from its last heartbeat."""
    tail = JsonlTail(work / "timeline" / "1.jsonl")
    def reached() -> Any:
        tail.poll()
        return proc.poll() is not None or next(
            (r for r in tail.records if r["what"] == "step" and r["step"] >= args.kill_step), None)

    rec = wait_for(reached, args.timeout, "rank 1 to reach the kill step", 0.01)
    if rec is True or proc.poll() is not None:
        raise RuntimeError(f"msrun exited {proc.returncode} before the kill:\n{(work / 'msrun.out').read_text()}")
    t_kill = time.time()
    os.kill(rec["pid"], signal.SIGSTOP if args.fault == "hang" else signal.SIGKILL)
    if args.fault == "hang":  # the fault is the stall: its last step mark (the heartbeat follows it at once)
        tail.poll()
        t_kill = max(r["t"] for r in tail.records if r["what"] == "step" and r["pid"] == rec["pid"])
    before = {}
    for f in (work / "timeline").glob("[0-9]*.jsonl"):
        recs = [r for r in JsonlTail(f).poll() if r["t"] <= t_kill]
        if recs:
            before[int(f.stem)] = recs[-1]["pid"]
    return t_kill, before


def reap_leftovers(work: Path) -> list[int]:
    """SIGKILL any process of this run still alive (ranks and schedulers are their own sessions); their pids."""
    left = []
    for f in (work / "timeline").glob("*.jsonl"):
        for pid in {r["pid"] for r in JsonlTail(f).poll()}:
            try:
                if str(work) in " ".join(psutil.Process(pid).cmdline()):
                    os.kill(pid, signal.SIGKILL)
                    left.append(pid)
            except (psutil.Error, OSError):
                continue
    return left


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
        steady += [b - a - step_sleep for a, b in zip(steps[1:], steps[2:], strict=False)]  # past the 1st step
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
                    TASKD_HEARTBEAT_TIMEOUT=str(args.heartbeat_timeout), **extra_env)  # the agent sees training resume
    proc = msrun(n, work, env, args)
    try:
        t_kill, before = kill_rank_1(work, proc, args)
        code = proc.wait(args.timeout)
        t_exit = time.time()
        events = job_events(f"127.0.0.1:{port}", job)
    finally:
        stop_process(proc)
        stop_process(ctl)
        left = reap_leftovers(work)
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
            "work": str(work), "env": extra_env, "left_behind": left}


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
        left = reap_leftovers(work)
    return {"ranks": n, "taskd": False, "exit_code": code, "exit_after": t_exit - t_kill, "work": str(work),
            "env": extra_env, "left_behind": left}


def _p50(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _spread(values: list[float | None]) -> str:
    got = sorted(v for v in values if v is not None)
    if not got:
        return "-"
    return f"{statistics.median(got):.2f}" + (f" ({got[0]:.2f}-{got[-1]:.2f})" if len(got) > 1 else "")


def report(runs: list[dict[str, Any]]) -> str:
    """Phases as rows (p50 over the runs), a column per size: taskd, then plain msrun's exit."""
    groups: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: (r["ranks"], not r["taskd"])):
        groups.setdefault((r["ranks"], r["taskd"]), []).append(r)
    heads = ["phase (s, p50)"] + [f"{'taskd' if t else 'plain msrun'} {n} ranks ({len(g)} run(s))"
                                  for (n, t), g in groups.items()]
    rows = [[name] + [_p50([r["phases"].get(name) for r in g]) if t else None for (_, t), g in groups.items()]
            for name, _ in PHASES]
    rows.append(["**kill -> every rank past a new step** (p50, min-max)"]
                + [_spread([r["total"] for r in g]) if t else "never" for (_, t), g in groups.items()])
    rows.append(["agent's \"training resumed ... after the fault\""]
                + [_spread([r.get("agent_says_resumed_after") for r in g]) for g in groups.values()])
    rows.append(["kill -> msrun exit"] + [_spread([r["exit_after"] for r in g]) for g in groups.values()])
    rows.append(["msrun exit code"] + [" ".join(str(r["exit_code"]) for r in g) for g in groups.values()])
    rows.append(["strategy"] + [" ".join(sorted({r.get("strategy") or "none" for r in g})) for g in groups.values()])
    return table(heads, rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=1, help="taskd runs per size (plain msrun: one)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--kill-step", type=int, default=13, help="rank 1 is killed once it completed this step")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--fault", choices=("kill", "hang"), default="kill", help="SIGKILL rank 1, or SIGSTOP it")
    p.add_argument("--heartbeat-timeout", type=float, default=None,
                   help="TASKD_HEARTBEAT_TIMEOUT (default 120 for a kill, 5 for a hang)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds each msrun may take")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for every run (repeatable)")
    p.add_argument("--label", default="", help="results go to msrun_recovery[_LABEL]_<n>.json")
    p.add_argument("--no-plain", action="store_true", help="skip the plain msrun runs")
    p.add_argument("--no-taskd", action="store_true", help="only the plain msrun runs")
    p.add_argument("--report", action="store_true", help="only print the table of the saved results")
    p.add_argument("--quick", action="store_true", help="one short taskd run of 2 ranks, no plain msrun (the tests')")
    args = p.parse_args()
    if args.quick:
        args.ranks, args.reps, args.no_plain, args.steps, args.ckpt_every, args.kill_step = [2], 1, True, 14, 5, 7
    extra = dict(kv.split("=", 1) for kv in args.env)
    if args.heartbeat_timeout is None:
        args.heartbeat_timeout = 5.0 if args.fault == "hang" else 120.0
    name = "msrun_recovery" + (f"_{args.label}" if args.label else "") + ("_hang" if args.fault == "hang" else "")
    if not args.report:
        for n in args.ranks:
            result = header(name, args)
            result["runs"] = runs = [] if args.no_taskd else [run_taskd(n, args, extra) for _ in range(args.reps)]
            write_result(f"{name}_{n}", result)
            if not args.no_plain:
                runs.append(run_plain(n, args, extra))
                write_result(f"{name}_{n}", result)
            print(report(runs))
    saved = []
    for n in args.ranks:
        path = Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS) / f"{name}_{n}.json"
        if path.exists():
            saved += json.loads(path.read_text())["runs"]
    what = "SIGSTOP (from its last step)" if args.fault == "hang" else "SIGKILL"
    print(f"\n{name}: {what} of rank 1 after step {args.kill_step} -> every rank past a new step\n")
    print(report(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
