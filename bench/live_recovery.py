"""Live recovery of a real DDP job: SIGKILL of one rank to every rank past its next step.

Runs examples/torch/train_ddp.py (DDP over gloo, ~9 M parameters by default) under these configurations,
one process of this script driving them all:

- taskd live `recover` + warm spare: `taskd run --strategies recover,job-rescheduling,exit --warm-spares 1`
- taskd live `recover` + script-mode spare: the same with `--warm-spare-mode script` (the spare has run the
  script up to `LiveGroup()`: its model is built before the kill)
- taskd live `recover`: the same without a spare (the replacement imports torch itself)
- taskd `job-rescheduling`: `--strategies job-rescheduling,exit` (every rank restarts from its checkpoint)
- torchrun `--max-restarts` (`python -m torch.distributed.run --standalone`: the whole group restarts)

Every rank appends `STEP TIME PID` to a progress file at each completed step (the example's
`--progress-dir`), so the same measurement applies to every launcher:

- **kill**: `time.time()` here, just before `os.kill(pid, SIGKILL)`, at a seeded random step and a
  seeded random point within it, of a seeded random rank (the same kill for every configuration of
  a repetition);
- **resumed**: S is the highest step any rank had completed at the kill; resumed is when the last
  rank completes a step > S (its own timestamp). Recomputed steps (replayed from a checkpoint) do
  not count as progress, so a whole-group restart pays for them here;
- **beyond one step**: kill → resumed minus one fault-free step of the same job (the median time between two
  consecutive steps of one process, over every rank's last 8 steps before the kill): what the recovery costs
  beyond redoing the step it cut, so that a figure means the same on a 2-core machine and on a GPU node;
- **recomputed**: the example's summary.json (steps computed - steps), survivors and the killed rank apart;
- **bit-identical**: final.pt equals a fault-free run of the same launcher family and size.

Phases (seconds after the kill) come from the agents' JSON log records (bench/run_taskd.py,
bench/run_torchrun.py), the ranks' own recovery records (summary.json) and the progress files.

    python bench/live_recovery.py [--quick] [--ranks 4,8] [--reps 5] [--seed 1] [--steps 40] [--ckpt-every 10]
                                  [--pg-timeout 60] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from common import (
    ROOT,
    TASKD_DRIVER,
    TORCHRUN_DRIVER,
    JsonlTail,
    bench_env,
    has_torch,
    header,
    ratio,
    stats,
    table,
    wait_for,
    write_result,
)

EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"

# (label, launcher family, extra launcher flags)
CONFIGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("taskd recover + warm spare", "taskd", ("--strategies", "recover,job-rescheduling,exit", "--warm-spares", "1")),
    ("taskd recover + script-mode spare", "taskd",
     ("--strategies", "recover,job-rescheduling,exit", "--warm-spares", "1", "--warm-spare-mode", "script")),
    ("taskd recover", "taskd", ("--strategies", "recover,job-rescheduling,exit")),
    ("taskd job-rescheduling", "taskd", ("--strategies", "job-rescheduling,exit")),
    ("torchrun --max-restarts", "torchrun", ()),
)
LIVE = ("taskd recover + warm spare", "taskd recover + script-mode spare", "taskd recover")
TORCHRUN = "torchrun --max-restarts"


@dataclass
class Kill:
    step: int  # the victim is killed while computing this step
    victim: int
    frac: float  # how far into the step (fraction of the recent step time)


@dataclass
class Progress:
    """The ranks' progress files, read as they grow: {rank: [(step, t, pid)]}."""

    folder: Path
    ranks: int
    name: str = "rank{}.progress"  # each rank's file in `folder` ("STEP TIME PID" lines)
    records: dict[int, list[tuple[int, float, int]]] = field(default_factory=dict)
    _pos: dict[int, int] = field(default_factory=dict)
    _partial: dict[int, bytes] = field(default_factory=dict)

    def poll(self) -> dict[int, list[tuple[int, float, int]]]:
        for r in range(self.ranks):
            try:
                with (self.folder / self.name.format(r)).open("rb") as fh:
                    fh.seek(self._pos.get(r, 0))
                    data = fh.read()
            except FileNotFoundError:
                continue
            self._pos[r] = self._pos.get(r, 0) + len(data)
            lines = (self._partial.get(r, b"") + data).split(b"\n")
            self._partial[r] = lines.pop()
            for line in lines:
                step, t, pid = line.split()
                self.records.setdefault(r, []).append((int(step), float(t), int(pid)))
        return self.records


class Launch:
    """One launcher process and everything it starts; `close()` leaves nothing running."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}
        self._looked = 0.0

    def look(self, every: float = 1.0) -> None:
        """Remember the launcher's descendants (ranks, spares) so close() can kill stragglers."""
        if time.monotonic() - self._looked < every:
            return
        self._looked = time.monotonic()
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def remember(self, pid: int) -> None:
        if pid not in self.seen:
            try:
                self.seen[pid] = psutil.Process(pid)
            except psutil.Error:
                pass

    def leftovers(self, grace: float = 3.0) -> list[int]:
        """After the launcher ended by itself: the pids of its descendants still running `grace` s later."""
        self.look(0)
        deadline = time.monotonic() + grace
        while True:
            alive = []
            for pid, p in self.seen.items():
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.Error:
                    pass
            if not alive or time.monotonic() > deadline:
                return sorted(alive)
            time.sleep(0.05)

    def close(self, grace: float = 10.0) -> None:
        self.look(0)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid)
                self.proc.kill()
                self.proc.wait(10)
        _killpg(self.proc.pid)
        for p in self.seen.values():
            try:
                if p.is_running():  # same pid *and* creation time: never a recycled pid
                    p.kill()
            except psutil.Error:
                pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def example_args(args: argparse.Namespace, run_dir: Path) -> list[str]:
    out = ["--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--ckpt-dir", str(run_dir / "ckpt"),
           "--out", str(run_dir / "out"), "--progress-dir", str(run_dir / "progress"), "--seed", str(args.seed),
           "--pg-timeout", str(args.pg_timeout)]
    if args.hidden:
        out += ["--hidden", str(args.hidden)]
    if args.layers:
        out += ["--layers", str(args.layers)]
    if args.step_sleep:
        out += ["--step-sleep", str(args.step_sleep)]
    return out


def drop_checkpoints(args: argparse.Namespace, run_dir: Path) -> None:
    """A measured job's checkpoints, unless --keep: up to 12 of 72 MB a job at 4 ranks (a 7-kill peers run held
    ~6 GB of them and ended in ENOSPC)."""
    if not args.keep:
        shutil.rmtree(run_dir / "ckpt", ignore_errors=True)


def taskd_saves(args: argparse.Namespace, family: str) -> list[str]:
    """The example's --ckpt-async under taskd only: torchrun's (and the peers') jobs restart from their checkpoints,
    and a background save the fault cut short would make them redo more steps (theirs stay blocking)."""
    return ["--ckpt-async"] if args.ckpt_async and family == "taskd" else []


def launch(family: str, flags: tuple[str, ...], n: int, args: argparse.Namespace, run_dir: Path) -> Launch:
    run_dir.mkdir(parents=True)
    env = bench_env(BENCH_EVENTS=str(run_dir / "agent.jsonl"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if family == "taskd":
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(n), "--max-restarts", "3",
               "--log-dir", str(run_dir / "logs"), *flags, str(EXAMPLE)]
    else:
        env = {k: v for k, v in env.items() if not k.startswith("TASKD_")}
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(n),
               "--max-restarts", str(args.torchrun_max_restarts), *flags, str(EXAMPLE)]
    return Launch([*cmd, *example_args(args, run_dir), *taskd_saves(args, family)], env, run_dir / "console.log")


Starter = Callable[[str, tuple[str, ...], int, argparse.Namespace, Path], Launch]


def run_once(label: str, family: str, flags: tuple[str, ...], n: int, args: argparse.Namespace, run_dir: Path,
             kill: Kill | None, starter: Starter = launch) -> dict[str, Any]:
    """One job from start to end, with at most one kill, started by `starter`; every wait is bounded."""
    t0 = time.time()
    job = starter(family, flags, n, args, run_dir)
    prog = Progress(run_dir / "progress", n)
    res: dict[str, Any] = {"config": label, "ranks": n, "kill": None if kill is None else vars(kill), "ok": False}
    try:
        if kill is not None:
            res.update(kill_and_watch(job, prog, kill, n, args))
        wait_for(lambda: (job.look(), job.proc.poll() is not None)[1], args.run_timeout - (time.time() - t0),
                 "the job to end", 0.05)
        res["rc"] = job.proc.returncode
        res["ok"] = job.proc.returncode == 0 and (run_dir / "out" / "final.pt").exists()
        res["leftovers"] = job.leftovers()  # processes the launcher left running when it ended by itself
    except (TimeoutError, RuntimeError) as exc:
        res["error"] = str(exc)
        if job.proc.poll() is not None:  # it ended by itself (e.g. it gave up): what it left running counts
            res["leftovers"] = job.leftovers()
    finally:
        job.close()
    res["seconds"] = time.time() - t0
    res.update(_read_outcome(run_dir, family, res.get("t_kill"), kill, n))
    return res


def kill_and_watch(job: Launch, prog: Progress, kill: Kill, n: int, args: argparse.Namespace) -> dict[str, Any]:
    def reached() -> bool:
        job.look()
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job ended (rc {job.proc.returncode}) before step {kill.step}")
        recs = prog.poll().get(kill.victim, [])
        return bool(recs) and recs[-1][0] >= kill.step - 1

    wait_for(reached, args.run_timeout, f"rank {kill.victim} to reach step {kill.step}", 0.003)
    recs = prog.records[kill.victim]
    recent = [b[1] - a[1] for a, b in zip(recs[-4:], recs[-3:], strict=False)] or [0.1]
    time.sleep(kill.frac * sorted(recent)[len(recent) // 2])
    pid = prog.poll()[kill.victim][-1][2]
    for rs in prog.records.values():
        for *_, p in rs[-1:]:
            job.remember(p)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    done_before = max(s for rs in prog.poll().values() for s, t, _ in rs if t <= t_kill)

    def resumed() -> dict[int, tuple[int, float, int]] | None:
        job.look()
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job ended (rc {job.proc.returncode}) before resuming")
        recs = prog.poll()
        first: dict[int, tuple[int, float, int]] = {}
        for r in range(n):
            after = [rec for rec in recs.get(r, []) if rec[0] > done_before and rec[1] > t_kill]
            if after:
                first[r] = after[0]
        return first if len(first) == n else None

    step_s = step_time(prog.records, t_kill)
    first = wait_for(resumed, args.resume_timeout, "every rank past its next step", 0.01)
    new_pid = first[kill.victim][2]
    created = _create_time(new_pid)
    resumed_s = max(t for _, t, _ in first.values()) - t_kill
    return {"t_kill": t_kill, "victim_pid": pid, "done_before_kill": done_before,
            "resumed_s": resumed_s, "step_s": step_s, "beyond_step_s": None if step_s is None else resumed_s - step_s,
            "survivors_kept_pid": all(first[r][2] == prog.records[r][0][2] for r in range(n) if r != kill.victim),
            "replacement_pid": new_pid,
            "replacement_created_s": None if created is None else created - t_kill,
            "replacement_first_step_s": min(t for s, t, p in prog.records[kill.victim] if p == new_pid) - t_kill}


def step_time(records: dict[int, list[tuple[int, float, int]]], before: float, last: int = 8) -> float | None:
    """The job's fault-free step time just before `before`: the median gap between two consecutive steps of one
    process, over every rank's `last` steps completed by then (None with fewer than two)."""
    gaps = []
    for recs in records.values():
        done = [r for r in recs if r[1] <= before][-(last + 1):]
        gaps += [b[1] - a[1] for a, b in zip(done, done[1:], strict=False) if b[0] == a[0] + 1 and b[2] == a[2]]
    return statistics.median(gaps) if gaps else None


def _create_time(pid: int) -> float | None:
    """The wall-clock time a process was created, to a clock tick (psutil's uses a boot time rounded to 1 s)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, ticks since boot
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)


def _read_outcome(run_dir: Path, family: str, t_kill: float | None, kill: Kill | None, n: int) -> dict[str, Any]:
    """Recomputed steps, strategies used and (for a kill) the phases from the agent's and ranks' records."""
    import json

    out: dict[str, Any] = {}
    summary_path = run_dir / "out" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    console = (run_dir / "console.log").read_text(errors="replace")
    out["strategies_used"] = re.findall(r"replaced rank\(s\) \S+ with ([\w-]+)", console)
    out["restarts"] = (console.count("Worker group FAILED") if family == "torchrun"
                       else len(re.findall(r"replaced rank\(s\) .* with (?:recover|job-rescheduling)", console)))
    if summary:
        rec = {int(r): v for r, v in summary["recomputed"].items()}
        out["recomputed"] = rec
        out["restart_count"] = summary.get("restart_count")
        if kill is not None:
            out["recomputed_survivors_max"] = max((v for r, v in rec.items() if r != kill.victim), default=0)
            out["recomputed_victim"] = rec.get(kill.victim)
    if t_kill is None:
        return out
    agent = JsonlTail(run_dir / "agent.jsonl")
    agent.poll()
    phases: dict[str, float | None] = {}

    def first_record(pattern: str) -> float | None:
        ts = [r["t"] for r in agent.records if r["t"] >= t_kill and re.search(pattern, r["msg"])]
        return min(ts) - t_kill if ts else None

    if family == "taskd":
        phases["agent_fault"] = first_record(r"^fault: rank")
        # the agent's restart record: live recover, once the group re-formed; job-rescheduling, ranks restarted
        # (the key keeps its name so that stored results compare; the console no longer says "recovered")
        phases["agent_recovered"] = first_record(r"^replaced rank")
        # the controller's round ends here: changeStrategy carried the generation and the agent wrote it
        phases["agent_named_generation"] = first_record(r"^live recovery: generation")
    else:
        phases["agent_fault"] = first_record(r"Worker group FAILED")
    if summary:
        events = [e for r, info in summary["ranks"].items() if int(r) != kill.victim
                  for e in info.get("recoveries", []) if e.get("time", 0) >= t_kill - 1]
        if events:
            phases["survivors_noticed"] = min(e["time"] for e in events) - t_kill
            phases["survivors_noticed_last"] = max(e["time"] for e in events) - t_kill
            phases["survivors_left"] = max(e["time"] + e.get("left_s", 0) for e in events) - t_kill
            if all("control_s" in e for e in events):  # read after the survivor freed its old wrapper (gc)
                phases["survivors_read_generation"] = max(e["time"] + e["control_s"] for e in events) - t_kill
            if all("total_s" in e for e in events):
                phases["survivors_rejoined"] = max(e["time"] + e["total_s"] for e in events) - t_kill
    out["phases_s"] = phases
    return out


def final_equal(a: Path, b: Path) -> bool | None:
    if not (a.exists() and b.exists()):
        return None
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)


def plan(args: argparse.Namespace, n: int, rep: int) -> Kill:
    rng = random.Random(f"{args.seed}/{n}/{rep}")
    lo, hi = max(2, args.steps // 4), max(3, (3 * args.steps) // 5)
    return Kill(step=rng.randint(lo, hi), victim=rng.randrange(n), frac=round(rng.uniform(0.1, 0.9), 3))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "resumed_s" in r]
    identical = [r.get("bit_identical") for r in runs]
    phases: dict[str, list[float]] = {}
    for r in ok:
        for k, v in (r.get("phases_s") or {}).items():
            if v is not None:
                phases.setdefault(k, []).append(v)
    for k in ("replacement_created_s", "replacement_first_step_s"):
        vals = [r[k] for r in ok if r.get(k) is not None]
        if vals:
            phases[k.removesuffix("_s")] = vals
    return {
        "runs": len(runs), "resumed": len(ok), "completed": sum(1 for r in runs if r["ok"]),
        "kill_to_resumed_s": stats([r["resumed_s"] for r in ok]),
        "step_s": stats([r["step_s"] for r in ok if r.get("step_s") is not None]),
        "beyond_step_s": stats([r["beyond_step_s"] for r in ok if r.get("beyond_step_s") is not None]),
        "recomputed_survivors_max": max((r["recomputed_survivors_max"] for r in runs
                                         if r.get("recomputed_survivors_max") is not None), default=None),
        "recomputed_survivors_mean": _mean([r.get("recomputed_survivors_max") for r in runs]),
        "recomputed_victim_max": max((r["recomputed_victim"] for r in runs
                                      if r.get("recomputed_victim") is not None), default=None),
        "recomputed_victim_mean": _mean([r.get("recomputed_victim") for r in runs]),
        "bit_identical": sum(1 for x in identical if x), "compared": sum(1 for x in identical if x is not None),
        "survivors_kept_pid": sum(1 for r in ok if r.get("survivors_kept_pid")),
        "strategies_used": sorted({s for r in runs for s in r.get("strategies_used", [])}),
        "restarts_mean": _mean([r.get("restarts") for r in runs]),
        "phases_p50_s": {k: stats(v)["p50"] for k, v in phases.items()},
    }


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def add_job_arguments(p: argparse.ArgumentParser, reps: int, resume_timeout: float = 120.0) -> None:
    """The job's and the kills' flags, the same in bench/peers.py."""
    p.add_argument("--ranks", default="4,8", help="ranks per job, comma-separated")
    p.add_argument("--reps", type=int, default=reps, help="kills per configuration and size")
    p.add_argument("--seed", type=int, default=1, help="seeds the kills (step, rank, point in the step)")
    p.add_argument("--steps", type=int, default=40, help="training steps per job")
    p.add_argument("--ckpt-every", type=int, default=10, help="the example's checkpoint interval (steps)")
    p.add_argument("--ckpt-async", action="store_true",
                   help="under taskd the example saves its checkpoints in the background (its --ckpt-async); "
                        "torchrun's and the peers' jobs keep blocking saves")
    p.add_argument("--hidden", type=int, default=0, help="the example's --hidden (0: its default, ~9 M parameters)")
    p.add_argument("--layers", type=int, default=0, help="the example's --layers (0: its default)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="the example's --step-sleep")
    p.add_argument("--pg-timeout", type=float, default=60.0,
                   help="the example's collective timeout (s): how long a rank blocked on a dead group can wait")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds one job may take in all")
    p.add_argument("--resume-timeout", type=float, default=resume_timeout, help="seconds from the kill to resumed")
    p.add_argument("--keep", default="", help="keep every job's files (logs, progress, outputs) under this directory")


def checked_sizes(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The job sizes of --ranks once the job's flags are checked (p.error on a bad one); [] without torch."""
    sizes = [int(s) for s in args.ranks.split(",") if s]
    if not sizes or min(sizes) < 2 or args.reps < 1 or args.steps < 8 or args.ckpt_every < 1:
        p.error("--ranks must list sizes >= 2, --reps >= 1, --steps >= 8, --ckpt-every >= 1")
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return []
    return sizes


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still ends its jobs (Launch.close)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 ranks, a small model, 1 repetition: checks the script works")
    add_job_arguments(p, reps=5)
    p.add_argument("--torchrun-max-restarts", type=int, default=3,
                   help="torchrun's --max-restarts (torch 2.13's whole-group restart of a gloo job can fail and "
                        "need several)")
    p.add_argument("--configs", default="", help="only these configurations (comma-separated label prefixes)")
    args = p.parse_args()
    if args.quick:
        args.ranks, args.reps, args.hidden, args.layers = "2", 1, 64, 2
        args.steps, args.ckpt_every, args.step_sleep = 20, 5, 0.1
        args.run_timeout, args.resume_timeout = min(args.run_timeout, 150.0), min(args.resume_timeout, 60.0)
    sizes = checked_sizes(p, args)
    if not sizes:
        return 2
    configs = [c for c in CONFIGS if not args.configs or any(c[0].startswith(x) for x in args.configs.split(","))]
    result = header("live_recovery", args)
    result.update({"sizes": sizes, "reps": args.reps, "seed": args.seed, "steps": args.steps,
                   "ckpt_every": args.ckpt_every, "ckpt_async": args.ckpt_async, "hidden": args.hidden or None,
                   "layers": args.layers or None,
                   "configs": [c[0] for c in configs], "runs": [], "references": {}, "summary": {}})
    with tempfile.TemporaryDirectory(prefix="taskd-bench-live-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            refs: dict[str, Path] = {}
            for family in sorted({c[1] for c in configs}):
                flags = next(c[2] for c in configs if c[1] == family)
                ref = run_once(f"reference {family}", family, flags, n, args, work / f"ref-{family}-{n}", None)
                print(f"reference {family} {n} ranks: ok={ref['ok']} in {ref['seconds']:.1f}s", flush=True)
                result["references"][f"{family}/{n}"] = ref
                refs[family] = work / f"ref-{family}-{n}" / "out" / "final.pt"
            if len(refs) == 2:
                result["references"][f"taskd_equals_torchrun/{n}"] = final_equal(refs["taskd"], refs["torchrun"])
            for rep in range(args.reps):
                kill = plan(args, n, rep)
                for i, (label, family, flags) in enumerate(configs):
                    run_dir = work / f"run-{n}-{rep}-{i}"
                    r = run_once(label, family, flags, n, args, run_dir, kill)
                    r["bit_identical"] = final_equal(run_dir / "out" / "final.pt", refs[family])
                    result["runs"].append(r)
                    print(f"{label} {n} ranks rep {rep}: kill rank {kill.victim} at step {kill.step}: "
                          f"resumed {_s(r.get('resumed_s'))} s, recomputed {r.get('recomputed')}, "
                          f"identical {r['bit_identical']}, used {r.get('strategies_used')}, ok {r['ok']}"
                          + (f", error: {r['error']}" if r.get("error") else ""), flush=True)
                    write_result("live_recovery", result)  # partial results survive an interrupted run
                    drop_checkpoints(args, run_dir)
            for label, _, _ in configs:
                result["summary"][f"{label}/{n}"] = summarize(
                    [r for r in result["runs"] if r["config"] == label and r["ranks"] == n])
    print_tables(result, configs, sizes)
    write_result("live_recovery", result)
    return 0


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


PHASES = ("agent_fault", "survivors_noticed", "survivors_noticed_last", "survivors_left", "agent_named_generation",
          "survivors_read_generation", "agent_recovered", "replacement_created", "survivors_rejoined",
          "replacement_first_step")


def print_tables(result: dict[str, Any], configs: list[tuple[str, str, tuple[str, ...]]], sizes: list[int]) -> None:
    rows, ratios = [], {}
    for n in sizes:
        tr = result["summary"].get(f"{TORCHRUN}/{n}")
        tr_p50 = tr["kill_to_resumed_s"]["p50"] if tr else None
        for label, _, _ in configs:
            s = result["summary"][f"{label}/{n}"]
            k = s["kill_to_resumed_s"]
            if label in LIVE:
                ratios[f"{label}/{n}"] = ratio(tr_p50, k["p50"])
            rows.append([label, n, f"{s['resumed']}/{s['runs']}", k["p50"], k["p99"],
                         f"{_s(s['recomputed_survivors_mean'])} / {s['recomputed_survivors_max']}",
                         f"{_s(s['recomputed_victim_mean'])} / {s['recomputed_victim_max']}",
                         f"{s['bit_identical']}/{s['compared']}", ",".join(s["strategies_used"]) or "-",
                         s["restarts_mean"], ratio(tr_p50, k["p50"])])
    result["ratios_torchrun_over_live_p50"] = ratios
    print("\nLive recovery of examples/torch/train_ddp.py: SIGKILL of one rank to every rank past its next step")
    print(table(["configuration", "ranks", "resumed", "kill → resumed p50 s", "kill → resumed p99 s",
                 "recomputed survivors mean / max", "recomputed killed rank mean / max", "bit-identical",
                 "strategies used", "restarts per kill", "torchrun / this (p50)"], rows, 2))
    print_beyond_step(result, [c[0] for c in configs], sizes)
    print_phases(result, [c[0] for c in configs], sizes)


GOAL_BEYOND_STEP_S = 0.2  # issue 36: at 8 ranks, the recovery's cost beyond the redone step


def print_beyond_step(result: dict[str, Any], labels: list[str], sizes: list[int]) -> None:
    """Kill → resumed minus one fault-free step of the same job (see the module's docstring), and the goal's verdict
    at the largest size for the live configurations."""
    rows = []
    for n in sizes:
        for label in labels:
            s = result["summary"][f"{label}/{n}"]
            b, st = s["beyond_step_s"], s["step_s"]
            verdict = "-"
            if label in LIVE and n >= 8 and b["p50"] is not None:
                verdict = "met" if b["p50"] <= GOAL_BEYOND_STEP_S else \
                    f"missed by {b['p50'] - GOAL_BEYOND_STEP_S:.2f} s"
            rows.append([label, n, st["p50"], s["kill_to_resumed_s"]["p50"], b["p50"], b["max"], verdict])
    print("\nThe recovery beyond the redone step: kill → every rank past its next step, minus one fault-free step "
          "(the median step just before the kill, same job)")
    print(table(["configuration", "ranks", "fault-free step p50 s", "kill → resumed p50 s", "beyond one step p50 s",
                 "max s", f"goal ≤ {GOAL_BEYOND_STEP_S} s at 8 ranks"], rows, 3))


def print_phases(result: dict[str, Any], labels: list[str], sizes: list[int]) -> None:
    """The phases table (p50 of each phase over a configuration's kills); bench/peers.py prints it too."""
    rows = [[label, n, *(result["summary"][f"{label}/{n}"]["phases_p50_s"].get(x) for x in PHASES)]
            for n in sizes for label in labels]
    print("\nPhases, seconds after the kill (p50; from the agent's log, the ranks' recovery records, progress files)")
    print(table(["configuration", "ranks", "agent fault", "first survivor noticed", "last survivor noticed",
                 "survivors left", "agent named the generation", "last survivor read it",
                 "agent: replaced / group re-formed", "replacement created", "survivors rejoined",
                 "replacement first step"], rows, 3))

if __name__ == "__main__":
    sys.exit(main())
