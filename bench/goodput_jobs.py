"""bench/goodput.py's jobs (--job): which training job runs under the fault schedule, which systems run it, and how
a run of it is read (its progress lines, its steps redone, its final state against the fault-free run's).

Why a module of its own: the HSDP job's systems are bench/sharded_live.py's (their definitions and their start()
are used from there, not copied), and its runs are read as sharded_live reads them (OUT/rank<R>.computed lines,
every rank's final shards), while the DDP job's are read from train_ddp.py's progress files and summary.json.

- ddp (the default): examples/torch/train_ddp.py, goodput.py's own systems;
- hsdp: examples/torch/train_hsdp.py's HSDP job (2 replica groups x ranks/2 shards, gloo on CPU; an MLP of
  --hidden HSDP_HIDDEN x --layers HSDP_LAYERS, ~3 M parameters, ~0.21 s a step at 4 ranks on 2 loaded cores,
  about the DDP job's), and sharded_live's systems: taskd live HSDP with a script-mode spare, taskd live pure
  FSDP2 (train_fsdp2_live.py, the same MLP sharded over every rank, snapshots every step), taskd
  job-rescheduling and torchrun from DCP checkpoints every --ckpt-every steps, torchft 0.2.0's HSDP. goodput.py's
  other systems run the DDP job only and are skipped with the reason (SKIP_FOR_HSDP).

Final state: a DDP run's final.pt, an HSDP run's every rank's final shards, each against the same system's first
fault-free run. torchft's HSDP is not compared (NOT_COMPARED: sharded_live does not either): a dead replica
group's batches of the steps the other trained alone are never processed, so its shards differ by design. Its job
runs --steps steps like every other system's (sharded_live runs it 3 x longer to measure one recovery; here the
job is the same work for every system): where the surviving group ends before the dead one is back, that group
trains its steps again from its start alone: no step is redone or never processed, but the two groups end with
different models, which "replica groups agree" shows (every HSDP run is checked so).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import sharded_live as sharded
from live_recovery import Launch, Progress, final_equal

JOBS = ("ddp", "hsdp")
HSDP_HIDDEN, HSDP_LAYERS, HSDP_BATCH = 1024, 3, 16  # ~3 M parameters: 0.21 s a step, 4 ranks, 2 loaded cores
HSDP_STEP_S = 0.21  # the estimate's step time for the HSDP job (measured loaded, 2026-12-05, 30 steps)
HSDP_SYSTEMS: tuple[sharded.System, ...] = sharded.SYSTEMS
NOT_COMPARED = {s.label: "its average across replica groups is its own, and a dead group's batches are never "
                "processed: its shards differ from a fault-free run's by design" for s in HSDP_SYSTEMS
                if s.family == "torchft"}
SKIP_FOR_HSDP = {  # goodput.py's DDP systems, by label prefix, and why --job hsdp does not run them
    "taskd live": "the DDP job's; --job hsdp runs taskd live HSDP + script-mode spare",
    "taskd +": "bench/peer_rank.py --api=snapshots trains the DDP job only (the HSDP job's in-memory restore: "
               "taskd live FSDP2, snapshots k=1)",
    "taskd job-rescheduling": "restarts from the DDP job's torch.save checkpoints; --job hsdp runs taskd "
                              "job-rescheduling (DCP)",
    "torchrun": "the DDP job's; --job hsdp runs torchrun from DCP checkpoints",
    "torchft": "Manager.allreduce of DDP gradients (bench/peer_rank.py); --job hsdp runs torchft 0.2.0 HSDP",
    "DLRover": "bench/dlrover_rank.py trains the DDP job only, in its own venv's torch 2.7",
}


def title(job: str) -> str:
    """The job, as the table's heading names it."""
    return "train_ddp.py" if job == "ddp" else "train_hsdp.py (HSDP, 2 replica groups; the FSDP2 row: " \
        "train_fsdp2_live.py)"


def systems(job: str, ddp: tuple[Any, ...]) -> tuple[Any, ...]:
    """The systems that run `job`; `ddp` is goodput.py's own table (the DDP job's)."""
    return ddp if job == "ddp" else HSDP_SYSTEMS


def ours(job: str, ddp_ours: set[str]) -> set[str]:
    """The labels of taskd's systems (the goal lines' candidates; every other system is a peer)."""
    return ddp_ours if job == "ddp" else {s.label for s in HSDP_SYSTEMS if s.family == "taskd"}


def skipped(job: str, ddp: tuple[Any, ...], chosen: list[str]) -> dict[str, str]:
    """The other systems named by --systems (`chosen`: prefixes, empty: all) that `job` does not run, each with why."""
    if job == "ddp":
        return {}
    return {s.label: why for s in ddp for prefix, why in SKIP_FOR_HSDP.items()
            if s.label.startswith(prefix) and (not chosen or any(s.label.startswith(x) for x in chosen))}


def hsdp_args(args: argparse.Namespace) -> argparse.Namespace:
    """goodput.py's arguments as sharded_live's start() reads them: every system trains --steps steps (torchft's
    too), the model HSDP_HIDDEN x HSDP_LAYERS unless --hidden/--layers say otherwise."""
    return argparse.Namespace(steps=args.steps, hidden=args.hidden or HSDP_HIDDEN, layers=args.layers or HSDP_LAYERS,
                              batch=args.batch, seed=args.seed, pg_timeout=args.pg_timeout,
                              ckpt_every=args.ckpt_every, step_sleep=args.step_sleep, torchft_steps=args.steps,
                              torchft_timeout=args.torchft_timeout)


def start_hsdp(system: sharded.System, n: int, args: argparse.Namespace, run_dir: Path) -> Launch:
    """sharded_live's start() of `system`, with goodput's restart budget and taskd's hang detection."""
    taskd = ("--heartbeat-timeout", str(args.heartbeat_timeout), "--stop-grace", str(args.stop_grace))
    return sharded.start(system, n, hsdp_args(args), run_dir, max_restarts=args.max_restarts, taskd_flags=taskd)


def progress(job: str, run_dir: Path, n: int) -> Progress:
    """Every rank's "STEP TIME PID" lines, as the job writes them."""
    if job == "ddp":
        return Progress(run_dir / "progress", n)
    return Progress(run_dir / "out", n, name="rank{}.computed")


def finished(job: str, run_dir: Path, n: int) -> bool:
    """The job wrote its final state (DDP: rank 0's final.pt; HSDP: every rank's final shards)."""
    if job == "ddp":
        return (run_dir / "out" / "final.pt").exists()
    return all((run_dir / "out" / f"rank{r}.pt").exists() for r in range(n))


def outcome(job: str, args: argparse.Namespace, run_dir: Path, n: int, system: Any = None) -> dict[str, Any]:
    """Steps redone per rank (DDP: its summary.json; HSDP: lines - distinct steps of each rank's .computed file,
    with the samples never processed counted from the steps a rank never completed, and whether the replica
    groups ended with the same model: see replicas_agree)."""
    if job == "ddp":
        summary = run_dir / "out" / "summary.json"
        if not summary.exists():
            return {}
        return {"redone": {int(r): v for r, v in json.loads(summary.read_text())["recomputed"].items()}}
    got = sharded.account(run_dir / "out", n, args.steps, args.batch, None)
    agree = replicas_agree(run_dir / "out", n) if system is not None and system.script == sharded.EXAMPLE else None
    return {"redone": got["redone"], "samples_never_processed": got["samples_never_processed"],
            "replicas_agree": agree}


def replicas_agree(out: Path, n: int) -> bool | None:
    """Whether rank r and rank r + n/2 (the same shard in the two replica groups) ended with equal shards: what an
    HSDP job must end with, and the check that holds where a run is not compared with a fault-free one (torchft:
    a replica group that its torchrun restarted after the other had finished trains every step again alone, and
    the job ends with two models). None where a rank wrote no shards."""
    half = n // 2
    return sharded.same_shards([(out / f"rank{r}.pt", out / f"rank{r + half}.pt") for r in range(half)])


def identical(job: str, system: Any, run_dir: Path, ref_dir: Path, n: int) -> bool | None:
    """The run's final state against the same system's fault-free run's; None where not compared or not there."""
    if job == "ddp":
        return final_equal(run_dir / "out" / "final.pt", ref_dir / "out" / "final.pt")
    if system.label in NOT_COMPARED:
        return None
    return sharded.identical(run_dir / "out", ref_dir / "out", n)


def check(job: str, ranks: int) -> str | None:
    """Why `ranks` cannot run `job`, or None."""
    if job == "hsdp" and (ranks < 4 or ranks % 2):
        return "--job hsdp needs an even --ranks >= 4 (2 replica groups of >= 2 shards)"
    return None
