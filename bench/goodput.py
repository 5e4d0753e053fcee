"""Goodput under a fault rate, side by side: the same job, the same seeded fault schedule, several systems, one run.

The job is bench/peers.py's (examples/torch/train_ddp.py: DDP over gloo, ~9 M parameters by default; a
checkpoint every --ckpt-every steps where the system restarts from disk). Faults arrive in wall time, from a
seeded schedule counted from the launch of the job: gaps of mean --mtbf seconds, drawn uniformly from 0.5 to 1.5
times it (`--arrivals uniform`: in one job of a few minutes, exponential gaps would make the number of faults
itself the largest noise; `--arrivals exponential` draws them so). Each fault is a SIGKILL of a seeded rank, or
(a --hang-share of them) a SIGSTOP of it: a hang, which a system notices only by a missing heartbeat, a
collective's timeout or (taskd's agent: seen stopped for STOPPED_AFTER, 1 s) the rank's stopped state. Every
system gets the same schedule, so a
system that runs longer meets more faults, as on a cluster. A fault that falls due while the job is not
training (starting, or not yet past the step after the previous fault) waits until every rank has completed a
step after the previous fault; one due after a rank completed the last step is dropped (the job is ending).

Systems (one not installed in this interpreter is skipped, with the reason):

- taskd live: `LiveGroup`'s `recover` with a warm spare that ran the script up to `LiveGroup()`;
- taskd with in-memory snapshots: the job as a plain DDP script (bench/peer_rank.py `--api=snapshots`, no
  `LiveGroup`), `TorchSnapshots.save` every --snapshot-every steps, `taskd run --snapshot-memory`, every rank
  restarted (`job-rescheduling`) from the newest step all ranks hold in memory;
- taskd job-rescheduling: every rank restarted from its newest common checkpoint on disk;
- torchrun with disk checkpoints and `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (bench/peers.py's fixed torchrun);
- torchft's live mode (`Manager.allreduce`, bench/run_torchft.py), where torchft is installed;
- DLRover 0.6.1's `dlrover-run --standalone` with its Flash Checkpoint in memory every --snapshot-every steps, in a
  venv of its own (torch 2.7: --dlrover-python, else $BENCH_DLROVER_PYTHON, else /work/venv-dlrover; skipped with
  the reason where none imports it; bench/goodput_dlrover.py); every rank restarted from the agent's memory.

With `--job hsdp` the job is examples/torch/train_hsdp.py's HSDP job instead, run by bench/sharded_live.py's
systems (taskd live HSDP + script-mode spare, taskd live pure FSDP2, taskd job-rescheduling and torchrun from DCP
checkpoints, torchft 0.2.0's HSDP; the others are skipped with the reason): bench/goodput_jobs.py.

taskd's systems run with `--heartbeat-timeout` (a stopped rank is found by its missing heartbeat); torchrun,
DLRover and torchft find it by the collectives' timeout (--pg-timeout; torchft's own --torchft-timeout).

Per system, from runs made back to back in this process: --baseline-runs fault-free runs (default 2; 1 with
--quick) around one run under the schedule's faults (half of them before it, half after, so that a drift of the
machine during the system's runs cancels in their mean), each timed from launch to the launcher's exit. Its row:
the fault-free time (the mean) and spread (the range), the time with faults, goodput (fault-free / with faults,
± the spread; also against the fastest fault-free system, which charges a system's steady-state cost), seconds
lost per fault, fault → every rank past its next step (each fault), steps redone (summed over the ranks, from the
job's summary.json), final parameters against the same system's first fault-free run, the samples never trained on
(0 where those are bit-identical: each batch is drawn from its rank's and step's seed, so identical parameters
mean every step's batches were applied once, in order), and leftovers (processes
of the job still running 3 s after its launcher ended by itself). Ratios: each system's lost seconds against the
best peer's (the non-taskd system that lost least) measured in the same run.

The goal lines (issue 36; arithmetic in bench/goodput_verdict.py): taskd's best configuration keeps goodput
>= 97 %, loses <= half the best peer's time, and the run counts as the goal run only where torchrun's goodput is
below 80 %. Each says "met" or "missed" only when its margin exceeds the fault-free spread, else "cannot tell"
and by how much; then, per system, what the lost time went to (detection, redone steps, the pause, the time
outside recoveries, the steady-state cost). Before it starts, the bench prints its estimated duration
(bench/goodput_plan.py: a model from the quiet run's per-fault costs, under this run's own schedule).

    python bench/goodput.py [--quick] [--ranks 4] [--steps 150] [--mtbf 30] [--hang-share 0.25] [--seed 1]
        [--baseline-runs 2] [--systems PREFIX,...] [--keep DIR] [--job ddp|hsdp]
    python bench/goodput.py --table bench/results/goodput.json   # the table and verdict again, older results too

The goal run (~28 min by the estimate, alone on the machine; --goal sets bench/goodput_plan.py's GOAL):

    PYTHONPATH=. python bench/goodput.py --goal --keep /tmp/goodput-goal
    # = --ranks 4 --steps 480 --mtbf 40 --hang-share 0.25 --seed 6 --heartbeat-timeout 5 --torchft-timeout 5
    #   --pg-timeout 30 --ckpt-every 10 --baseline-runs 2 --run-timeout 270
    #   --systems "taskd live,taskd +,torchrun,torchft"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import goodput_dlrover as dlrover
import goodput_jobs as jobs
import sharded_live
from common import TASKD_DRIVER, TORCHRUN_DRIVER, bench_env, fmt, has_torch, header, table, write_result
from goodput_plan import GOAL, estimate, estimate_lines
from goodput_verdict import breakdown, compare, goodput_text, row, verdict_lines
from live_recovery import EXAMPLE, Launch, Progress, drop_checkpoints, example_args
from peers import PEER_RANK, TASKD_LIVE, TORCHFT_DRIVER, System, missing

LIVE = "taskd live + script-mode spare"
SNAPSHOTS = "taskd + in-memory snapshots"
TORCHRUN = "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
DLROVER = "DLRover dlrover-run + Flash Checkpoint in memory"
SYSTEMS: tuple[System, ...] = (
    System(LIVE, "taskd", (*TASKD_LIVE, "--warm-spares", "1", "--warm-spare-mode", "script"), quick=True),
    System(SNAPSHOTS, "snapshots", ("--strategies", "job-rescheduling,exit")),
    System("taskd job-rescheduling (disk)", "taskd", ("--strategies", "job-rescheduling,exit")),
    System(TORCHRUN, "torchrun", env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),), quick=True),
    System("torchft, Manager.allreduce", "torchft", ("--api=torchft",), needs="torchft"),
    System(DLROVER, "dlrover"),
)
OURS = {s.label for s in SYSTEMS if s.family in ("taskd", "snapshots")}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the job's launch
    kind: str  # "kill" (SIGKILL) or "hang" (SIGSTOP)
    rank: int


def fault_schedule(seed: int, n: int, mtbf: float, hang_share: float, horizon: float, limit: int,
                   arrivals: str = "uniform") -> list[Fault]:
    """The seeded schedule every system gets: gaps of mean `mtbf` s (uniform in [0.5, 1.5] x mtbf, or exponential)
    up to `horizon` s, at most `limit` faults."""
    rng = random.Random(f"goodput/{seed}/{n}")
    out: list[Fault] = []
    t = 0.0
    while len(out) < limit:
        t += rng.expovariate(1.0 / mtbf) if arrivals == "exponential" else rng.uniform(0.5, 1.5) * mtbf
        if t > horizon:
            break
        out.append(Fault(round(t, 3), "hang" if rng.random() < hang_share else "kill", rng.randrange(n)))
    return out


def start(system: System, n: int, args: argparse.Namespace, run_dir: Path) -> Launch:
    """Launch `system`'s job of `n` ranks; every system gets the same job arguments."""
    if args.job == "hsdp":
        return jobs.start_hsdp(system, n, args, run_dir)  # type: ignore[arg-type]
    run_dir.mkdir(parents=True)
    env = bench_env(BENCH_EVENTS=str(run_dir / "agent.jsonl"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    **dict(system.env))
    job = example_args(args, run_dir)
    restarts = str(args.max_restarts)
    if system.label in OURS:
        script = [str(EXAMPLE)] if system.family == "taskd" else \
            ["--snapshot-memory", args.snapshot_memory, str(PEER_RANK), "--api=snapshots",
             f"--snapshot-every={args.snapshot_every}"]
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(n), "--max-restarts", restarts,
               "--heartbeat-timeout", str(args.heartbeat_timeout), "--stop-grace", str(args.stop_grace),
               "--log-dir", str(run_dir / "logs"), *system.flags, *script, *job]
        return Launch(cmd, env, run_dir / "console.log")
    env = {k: v for k, v in env.items() if not k.startswith("TASKD_")}
    if system.family == "torchrun":
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(n),
               "--max-restarts", restarts, str(EXAMPLE), *job]
    elif system.family == "dlrover":  # its venv's torch 2.7, not this interpreter's
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        env["ELASTIC_JOB_NAME"] = dlrover.job_name(run_dir)
        cmd = dlrover.command(args.dlrover_python, n, args.max_restarts, args.snapshot_every, job)
    else:
        cmd = [sys.executable, str(TORCHFT_DRIVER), "--replicas", str(n), "--max-restarts", restarts,
               "--timeout", str(args.torchft_timeout), str(PEER_RANK), *system.flags, *job]
    return Launch(cmd, env, run_dir / "console.log")


class Injector:
    """Fires a schedule's faults into a running job (see the module's docstring for when) and times each one's
    recovery: fault → every rank past a step beyond the highest step any rank had completed at the fault."""

    def __init__(self, job: Launch, prog: Progress, n: int, steps: int, faults: list[Fault], t0: float) -> None:
        self.job, self.prog, self.n, self.steps, self.t0 = job, prog, n, steps, t0
        self.pending = list(faults)
        self.fired: list[dict[str, Any]] = []
        self.dropped = 0

    def tick(self) -> None:
        recs = self.prog.poll()
        last = self.fired[-1] if self.fired else None
        if last is not None and "resumed_s" not in last:
            firsts = [next((t for s, t, _ in recs.get(r, []) if s > last["done_before"] and t > last["t_abs"]),
                           None) for r in range(self.n)]
            if None in firsts:
                return
            last["resumed_s"] = max(firsts) - last["t_abs"]  # type: ignore[operator]
        if not self.pending or time.time() - self.t0 < self.pending[0].at or len(recs) < self.n:
            return
        if any(rs[-1][0] >= self.steps - 1 for rs in recs.values()):
            self.dropped += len(self.pending)  # the job is ending
            self.pending.clear()
            return
        self._fire(self.pending.pop(0), recs)

    def _fire(self, fault: Fault, recs: dict[int, list[tuple[int, float, int]]]) -> None:
        for rs in recs.values():
            self.job.remember(rs[-1][2])
        pid = recs[fault.rank][-1][2]
        t = time.time()
        try:
            os.kill(pid, signal.SIGSTOP if fault.kind == "hang" else signal.SIGKILL)
        except ProcessLookupError:  # it ended between its record and now: the fault waits for the next tick
            self.pending.insert(0, fault)
            return
        done = max(s for rs in self.prog.poll().values() for s, ts, _ in rs if ts <= t)
        self.fired.append({**asdict(fault), "pid": pid, "t_abs": t, "t": t - self.t0, "delay_s": t - self.t0 - fault.at,
                           "done_before": done})


def run_job(system: System, n: int, args: argparse.Namespace, run_dir: Path, faults: list[Fault]) -> dict[str, Any]:
    """One job from launch to its launcher's exit under the schedule `faults`; every wait is bounded."""
    t0 = time.time()
    job = start(system, n, args, run_dir)
    inj = Injector(job, jobs.progress(args.job, run_dir, n), n, args.steps, faults, t0)
    res: dict[str, Any] = {"system": system.label, "ranks": n, "faulted": bool(faults), "ok": False}
    try:
        while job.proc.poll() is None:
            if time.time() - t0 > args.run_timeout:
                res["stopped_at_s"] = time.time() - t0  # with faults it took longer than this: a bound
                raise TimeoutError(f"the job did not end within --run-timeout {args.run_timeout} s")
            job.look()
            inj.tick()
            time.sleep(0.01)
        res["seconds"] = time.time() - t0
        inj.tick()
        res["rc"] = job.proc.returncode
        res["ok"] = job.proc.returncode == 0 and jobs.finished(args.job, run_dir, n)
        res["leftovers"] = job.leftovers()
    except TimeoutError as exc:
        res["error"] = str(exc)
    finally:
        job.close()
        if system.family == "dlrover":  # its agent's shared memory and sockets, removed after every job
            res["residue"] = dlrover.clean(dlrover.job_name(run_dir))
    detected(run_dir / "agent.jsonl", inj.fired)
    res["faults"] = [{k: v for k, v in f.items() if k != "t_abs"} for f in inj.fired]
    res["faults_dropped"] = inj.dropped + len(inj.pending)
    res.update(jobs.outcome(args.job, args, run_dir, n, system))
    if not res["ok"]:  # a job that did not end left its steps undone, not unprocessed: "-", as sharded_live
        res.pop("samples_never_processed", None)
    return res


def detected(events: Path, fired: list[dict[str, Any]]) -> None:
    """Each fault's detection where the job's agent logs it (taskd's systems): its time to the agent's first
    "fault: rank R (pid P)" record of the faulted process ("detected_s"); other systems log no such record."""
    if not events.exists():
        return
    recs = [json.loads(line) for line in events.read_text().splitlines() if line.startswith("{")]
    for f in fired:
        ts = [r["t"] for r in recs if r["msg"].startswith("fault: ") and f"(pid {f['pid']})" in r["msg"]
              and r["t"] >= f["t_abs"]]
        if ts:
            f["detected_s"] = min(ts) - f["t_abs"]


def measure(system: System, n: int, args: argparse.Namespace, work: Path, faults: list[Fault],
            result: dict[str, Any]) -> dict[str, Any]:
    """The system's --baseline-runs fault-free runs, half before and half after its run under `faults` (the first
    half the larger), and the row that compares them."""
    run_dir = work / f"{system.family}-{len(result['rows'])}"
    before = (args.baseline_runs + 1) // 2
    refs: list[dict[str, Any]] = []
    ref_dirs = [run_dir.with_name(f"{run_dir.name}-ref{k}") for k in range(args.baseline_runs)]
    for k in range(before):
        refs.append(_reference(system, n, args, ref_dirs[k]))
    run = run_job(system, n, args, run_dir, faults)
    run["bit_identical"] = jobs.identical(args.job, system, run_dir, ref_dirs[0], n)
    print(f"{system.label}: with faults {run.get('seconds', float('nan')):.1f} s, "
          f"{len(run['faults'])} faults {[(f['kind'], f['rank'], _r(f.get('resumed_s'))) for f in run['faults']]}, "
          f"redone {run.get('redone')}, identical {run['bit_identical']}, leftovers {run.get('leftovers')}, "
          + (f"residue {run['residue']}, " if "residue" in run else "")
          + f"ok {run['ok']}" + (f", error: {run['error']}" if run.get("error") else ""), flush=True)
    for k in range(before, args.baseline_runs):
        refs.append(_reference(system, n, args, ref_dirs[k]))
    result["runs"] += [*refs[:before], run, *refs[before:]]
    for d in (*ref_dirs, run_dir):
        drop_checkpoints(args, d)
    return row(system.label, system.label not in jobs.ours(args.job, OURS), refs, run, args.run_timeout)


def _reference(system: System, n: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    ref = run_job(system, n, args, run_dir, [])
    print(f"{system.label}: fault-free {ref.get('seconds', float('nan')):.1f} s, ok {ref['ok']}"
          + (f", error: {ref['error']}" if ref.get("error") else ""), flush=True)
    return ref


def verdict(result: dict[str, Any]) -> None:
    """The peers' ratios on each row, and the goal lines with what each system's lost time went to."""
    s, rows = result["settings"], result["rows"]
    v = compare(rows)
    result["best_peer"] = v["best_peer"]["system"] if v["best_peer"] else None
    result["taskd_best"] = v["best"]["system"] if v["best"] else None
    result["noise_floor_s"] = v["floor_s"]
    result["goals"] = {k: None if v[k] is None else v[k].verdict for k in ("goodput", "peer", "qualifies")}
    detect = {"taskd": s["heartbeat_timeout"], "snapshots": s["heartbeat_timeout"], "torchrun": s["pg_timeout"],
              "torchft": s["torchft_timeout"], "dlrover": s["pg_timeout"]}
    family = {x.label: x.family for x in jobs.systems(s.get("job", "ddp"), SYSTEMS)}
    lines = verdict_lines(v)
    lines.append("where the lost time went (per system):")
    lines += ["  " + breakdown(r, s["steps"], s["ranks"], float(detect.get(family.get(r["system"], ""), 0.0)),
                               v["fastest"]) for r in rows if r["lost_s"] is not None]
    result["verdict"] = "\n".join(lines)


def print_table(result: dict[str, Any]) -> None:
    lines = []
    for r in result["rows"]:
        over, peer_bound = ("> ", "< ") if r["bound"] else ("", ""), next(
            (p["bound"] for p in result["rows"] if p["system"] == result.get("best_peer")), False)
        lines.append([r["system"], r["fault_free_s"], r.get("fault_free_spread_s"), over[0] + fmt(r["with_faults_s"]),
                      f"{r['faults']} ({r['kills']}/{r['hangs']})", goodput_text(r),
                      over[1] + _pct(r["goodput_vs_fastest"]), over[0] + fmt(r["lost_per_fault_s"]),
                      r["fault_to_resumed_s"]["p50"], r["fault_to_resumed_s"]["max"], r["redone_steps"],
                      _v(r["bit_identical"]), _never_processed(r["bit_identical"], r.get("samples_never_processed")),
                      _leftovers(r),
                      "-" if r["lost_over_best_peer"] is None else
                      f"{'< ' if peer_bound and not r['bound'] else '> ' if r['bound'] and not peer_bound else ''}"
                      f"{r['lost_over_best_peer']:.2f}×"])
    s = result["settings"]
    print(f"\nGoodput: {s['ranks']} ranks of {jobs.title(s.get('job', 'ddp'))}, {s['steps']} steps, faults every "
          f"{s['mtbf']} s on average "
          f"(seed {s['seed']}, {s['hang_share']:.0%} hangs), {s.get('baseline_runs', 1)} fault-free run(s) per system")
    print(table(["system", "fault-free s", "spread s", "with faults s", "faults (kills/hangs)", "goodput",
                 "goodput vs fastest fault-free", "lost s per fault", "fault → resumed p50 s", "max s",
                 "steps redone (all ranks)", "bit-identical", "samples never processed", "leftovers",
                 "lost / best peer's"], lines, 2))
    for label, why in result["skipped"].items():
        print(f"skipped: {label}: {why}")
    for label, why in jobs.NOT_COMPARED.items():
        if s.get("job") == "hsdp" and any(r["system"] == label for r in result["rows"]):
            print(f"bit-identical not compared: {label}: {why}")
    if agree := {r["system"]: r["replicas_agree"] for r in result["runs"] if r["faulted"] and "replicas_agree" in r
                 and r["replicas_agree"] is not None}:
        print("the replica groups' final shards agree (rank r and r + ranks/2, the run with faults): "
              + ", ".join(f"{label}: {v}" for label, v in agree.items()))
    print(result["verdict"])


def _never_processed(identical: bool | None, counted: int | None = None) -> str:
    """Samples the job never trained on. The HSDP job's are counted (`counted`: the steps a rank never completed x
    its batch). The DDP example's batches are drawn from the step's seed, so final parameters bit-identical to the
    fault-free run's prove every step's batches were applied once, in order: 0. A run not identical may have
    dropped or doubled some ("?"); one that did not finish says nothing ("-")."""
    if counted is not None:
        return str(counted)
    return "-" if identical is None else "0" if identical else "?"


def _leftovers(r: dict[str, Any]) -> str:
    """Processes left running, and the named objects (shared memory, sockets) a job's launcher left on the node
    after the run with faults, which the bench removed (DLRover's agent: bench/goodput_dlrover.py)."""
    files = f" + {len(r['residue'])} files" if r.get("residue") else ""
    return _v(None if r["leftovers"] is None else len(r["leftovers"])) + files


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _r(v: float | None) -> str | None:
    return None if v is None else f"{v:.2f}s"


def _v(v: Any) -> str:
    return "-" if v is None else str(v)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 ranks (4 with --job hsdp), a small model, one kill, "
                   "taskd live and torchrun")
    p.add_argument("--job", choices=jobs.JOBS, default="ddp", help="the training job: train_ddp.py (ddp) or "
                   "train_hsdp.py's HSDP job with bench/sharded_live.py's systems (hsdp; bench/goodput_jobs.py)")
    p.add_argument("--batch", type=int, default=jobs.HSDP_BATCH, help="samples per rank per step (--job hsdp)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=150, help="training steps per job")
    p.add_argument("--ckpt-every", type=int, default=10, help="disk checkpoint interval (steps) of train_ddp.py")
    p.add_argument("--hidden", type=int, default=0, help="the example's --hidden (0: its default, ~9 M parameters; "
                   f"--job hsdp: {jobs.HSDP_HIDDEN})")
    p.add_argument("--layers", type=int, default=0, help=f"the example's --layers (0: its default; --job hsdp: "
                   f"{jobs.HSDP_LAYERS})")
    p.add_argument("--step-sleep", type=float, default=0.0, help="the example's --step-sleep")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault schedule and the job")
    p.add_argument("--mtbf", type=float, default=30.0, help="mean seconds between faults")
    p.add_argument("--arrivals", choices=("uniform", "exponential"), default="uniform",
                   help="how the gaps between faults are drawn (mean --mtbf either way)")
    p.add_argument("--hang-share", type=float, default=0.25, help="share of the faults that are SIGSTOP hangs")
    p.add_argument("--max-faults", type=int, default=1000, help="at most this many faults per job")
    p.add_argument("--pg-timeout", type=float, default=30.0, help="the collectives' timeout (s), every system")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0, help="taskd's --heartbeat-timeout (s)")
    p.add_argument("--stop-grace", type=float, default=5.0, help="taskd's --stop-grace (s)")
    p.add_argument("--snapshot-every", type=int, default=1, help="the snapshots system's interval (steps)")
    p.add_argument("--snapshot-memory", default="2G", help="taskd run --snapshot-memory of the snapshots system")
    p.add_argument("--max-restarts", type=int, default=100, help="every launcher's restart budget")
    p.add_argument("--torchft-timeout", type=int, default=5, help="torchft's collective and Manager timeout (s)")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one job may take in all")
    p.add_argument("--systems", default="", help="only these systems (comma-separated label prefixes)")
    p.add_argument("--keep", default="", help="keep every job's files under this directory")
    p.add_argument("--dlrover-python", default="", metavar="PATH",
                   help="the python of DLRover 0.6.1's venv (torch 2.7) for the DLRover system (default: "
                        f"${dlrover.ENV_PYTHON}, else {dlrover.DEFAULT_PYTHON} if it exists; none: skipped)")
    p.add_argument("--table", default="", metavar="RESULTS_JSON",
                   help="only print the table of a stored result (bench/results/goodput.json) and exit")
    p.add_argument("--baseline-runs", type=int, default=None,
                   help="fault-free runs per system, around its run with faults (default 2; 1 with --quick): "
                        "their spread is the noise a verdict must exceed")
    p.add_argument("--goal", action="store_true", help="the goal run's settings (bench/goodput_plan.py GOAL; "
                   "~28 min alone on 2 cores); flags given beside it override them")
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--goal", action="store_true")
    if pre.parse_known_args()[0].goal:
        p.set_defaults(**GOAL)
    args = p.parse_args()
    if args.quick and args.goal:
        p.error("--quick and --goal are two different runs: give one")
    if args.keep and Path(args.keep).is_dir() and any(Path(args.keep).iterdir()):
        p.error(f"--keep {args.keep} holds files already: name an empty or new directory (its runs' names repeat)")
    if args.baseline_runs is None:
        args.baseline_runs = 1 if args.quick else 2
    if args.quick:
        args.ranks, args.hidden, args.layers, args.steps, args.ckpt_every = 2, 64, 2, 30, 5
        args.step_sleep, args.mtbf, args.hang_share, args.max_faults = 0.05, 0.5, 0.0, 1
        args.run_timeout = min(args.run_timeout, 120.0)
        if args.job == "hsdp":  # 2 replica groups of 2 shards
            args.ranks, args.steps = 4, 40
    if args.ranks < 2 or args.steps < 8 or args.ckpt_every < 1 or args.mtbf <= 0 or not 0 <= args.hang_share <= 1 \
            or args.baseline_runs < 1:
        p.error("--ranks >= 2, --steps >= 8, --ckpt-every >= 1, --mtbf > 0, 0 <= --hang-share <= 1 and "
                "--baseline-runs >= 1")
    if why := jobs.check(args.job, args.ranks):
        p.error(why)
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still ends its job (run_job's finally)
    if args.table:
        return reprint(Path(args.table))
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return 2
    prefixes = [x for x in args.systems.split(",") if x]
    chosen = [s for s in jobs.systems(args.job, SYSTEMS) if not prefixes or any(s.label.startswith(x)
                                                                                 for x in prefixes)]
    skipped = jobs.skipped(args.job, SYSTEMS, prefixes)
    absent = missing if args.job == "ddp" else sharded_live.missing
    skipped.update({s.label: why for s in chosen if (why := absent(s))})
    if args.quick and not args.systems:
        skipped.update({s.label: "not run by --quick (name it with --systems)" for s in chosen
                        if not s.quick and s.label not in skipped})
    versions: dict[str, str] = {}
    if any(s.family == "dlrover" and s.label not in skipped for s in chosen):  # probed only when it would run
        why, versions = dlrover.probe(args.dlrover_python)
        args.dlrover_python = dlrover.find_python(args.dlrover_python)
        skipped.update({s.label: why for s in chosen if s.family == "dlrover" and why})
    systems = [s for s in chosen if s.label not in skipped]
    faults = fault_schedule(args.seed, args.ranks, args.mtbf, args.hang_share, args.run_timeout, args.max_faults,
                            args.arrivals)
    result = header("goodput", args)
    result.update({"settings": {k: getattr(args, k) for k in (
        "ranks", "steps", "ckpt_every", "hidden", "layers", "step_sleep", "seed", "mtbf", "arrivals", "hang_share",
        "pg_timeout", "heartbeat_timeout", "stop_grace", "snapshot_every", "snapshot_memory", "max_restarts",
        "torchft_timeout", "run_timeout", "baseline_runs", "dlrover_python", "job", "batch")},
        "dlrover_versions": versions, "schedule": [asdict(f) for f in faults], "systems": [s.label for s in systems],
        "skipped": skipped, "runs": [], "rows": []})
    est = estimate([x.label for x in systems], result["settings"], [(f.at, f.kind) for f in faults],
                   **({"step_s": jobs.HSDP_STEP_S} if args.job == "hsdp" else {}))
    result["estimate_s"] = est["total_s"]
    print("\n".join(estimate_lines(est, args.baseline_runs, jobs.title(args.job))), flush=True)
    for label, why in skipped.items():  # and again under the table
        print(f"skipped: {label}: {why}", flush=True)
    with tempfile.TemporaryDirectory(prefix="taskd-bench-goodput-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for system in systems:
            result["rows"].append(measure(system, args.ranks, args, work, faults, result))
            write_result("goodput", result)  # partial results survive an interrupted run
    verdict(result)
    print_table(result)
    write_result("goodput", result)
    return 0


def reprint(path: Path) -> int:
    """The table and verdict of a stored result, its rows made again by this version of the script from its runs:
    each system's fault-free runs and its run with faults (older results hold one fault-free run per system)."""
    result = json.loads(path.read_text())
    by_system: dict[str, list[dict[str, Any]]] = {}
    for run in result["runs"]:
        by_system.setdefault(run["system"], []).append(run)
    result["settings"].setdefault("baseline_runs", 1)
    ours = jobs.ours(result["settings"].get("job", "ddp"), OURS)
    result["rows"] = [row(label, label not in ours, [r for r in runs if not r["faulted"]], faulted,
                          result["settings"].get("run_timeout", 900.0))
                      for label, runs in by_system.items()
                      for faulted in [next((r for r in runs if r["faulted"]), None)] if faulted is not None]
    verdict(result)
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
