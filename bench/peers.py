"""taskd side by side with the peers a PyTorch user would pick instead: the same DDP job, the same seeded kills.

The job is examples/torch/train_ddp.py's (DDP over gloo, ~9 M parameters by default, 40 steps, a
checkpoint every 10): under taskd and torchrun the example itself, under torchft and NVRx
bench/peer_rank.py, which imports the example's model, data and arguments and uses the peer's own
API. Systems (a peer that is not installed in this interpreter is skipped with the reason):

- taskd live `recover` with a spare that has run the script up to `LiveGroup()` (`--warm-spare-mode
  script`), with a warm spare that has imported torch, without one, and taskd `job-rescheduling`;
- torchrun 2.13 `--max-restarts 3`, plain and with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (the
  fix users apply for pytorch#135712: a new TCPStore per restart, so no rank reads a dead one's address);
- torchft 0.2.0 (bench/run_torchft.py: a Lighthouse and one `torchrun --nproc-per-node 1` per
  replica; every step needs every replica), with `Manager.allreduce` per gradient and with torchft's
  `DistributedDataParallel` wrapper;
- NVRx `ft_launcher` (nvidia-resiliency-ext), heartbeats from its `RankMonitorClient` every step.

The measure is bench/live_recovery.py's (its `run_once`: progress files, SIGKILL of a seeded rank at a
seeded point of a seeded step, kill → every rank past its next step; steps redone from each system's
summary.json; final.pt against that system's fault-free run). Leftovers: processes of the job still
running 3 s after its launcher ended by itself (not checked where the benchmark had to stop it).

With `--ckpt-async` taskd's job saves its checkpoints in the background (the example's `--ckpt-async`,
`CheckpointManager.save_async`, held while a recovery runs); torchrun's and the peers' jobs keep their
blocking saves, since they restart from those checkpoints and a write the fault cut short would make them
redo more steps.

    python bench/peers.py [--quick] [--ranks 4,8] [--reps 3] [--seed 1] [--ckpt-async] [--systems PREFIX,...]
        [--keep DIR]

Install the peers in a venv of their own (never a dependency of taskd): `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import BENCH_DIR, TASKD_DRIVER, TORCHRUN_DRIVER, bench_env, header, ratio, table, write_result
from live_recovery import (
    EXAMPLE,
    Launch,
    add_job_arguments,
    checked_sizes,
    drop_checkpoints,
    example_args,
    final_equal,
    plan,
    print_phases,
    run_once,
    summarize,
    taskd_saves,
)

PEER_RANK = BENCH_DIR / "peer_rank.py"
TORCHFT_DRIVER = BENCH_DIR / "run_torchft.py"
LIVE_SPARE = "taskd live + warm spare"
SCRIPT_SPARE = "taskd live + script-mode spare"  # the spare has run the script up to LiveGroup(): its model built
TASKD_LIVE = ("--strategies", "recover,job-rescheduling,exit")


@dataclass(frozen=True)
class System:
    label: str
    family: str  # how it is started (see start()); also names its fault-free reference run
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs: str = ""  # a module that must be importable
    quick: bool = False  # run by --quick


SYSTEMS: tuple[System, ...] = (
    System(SCRIPT_SPARE, "taskd", (*TASKD_LIVE, "--warm-spares", "1", "--warm-spare-mode", "script")),
    System(LIVE_SPARE, "taskd", (*TASKD_LIVE, "--warm-spares", "1"), quick=True),
    System("taskd live", "taskd", TASKD_LIVE),
    System("taskd job-rescheduling", "taskd", ("--strategies", "job-rescheduling,exit")),
    System("torchrun --max-restarts 3", "torchrun"),
    System("torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun",
           env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),), quick=True),
    System("torchft, Manager.allreduce", "torchft", ("--api=torchft",), needs="torchft"),
    System("torchft + its DDP wrapper", "torchft-ddp", ("--api=torchft-ddp",), needs="torchft"),
    System("NVRx ft_launcher", "nvrx", ("--api=nvrx",), needs="nvidia_resiliency_ext"),
)
BY_LABEL = {s.label: s for s in SYSTEMS}


def missing(system: System) -> str | None:
    """Why `system` cannot run in this interpreter, or None."""
    if system.needs and importlib.util.find_spec(system.needs) is None:
        pkg = {"torchft": "torchft==0.2.0", "nvidia_resiliency_ext": "nvidia-resiliency-ext==0.4.1"}[system.needs]
        return f"{system.needs} is not installed in {sys.executable} (`pip install {pkg}`, or `.[bench]`)"
    return None


def start(family: str, flags: tuple[str, ...], n: int, args: argparse.Namespace, run_dir: Path) -> Launch:
    """live_recovery's Starter for every system; `flags` is the system's label (its env and flags are looked up)."""
    system = BY_LABEL[flags[0]] if flags and flags[0] in BY_LABEL else System("reference", family)
    run_dir.mkdir(parents=True)
    env = bench_env(BENCH_EVENTS=str(run_dir / "agent.jsonl"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    **dict(system.env))
    if family != "taskd":
        env = {k: v for k, v in env.items() if not k.startswith("TASKD_")}
    job_args = [*example_args(args, run_dir), *taskd_saves(args, family)]
    restarts = str(args.torchrun_max_restarts)
    if family == "taskd":
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(n), "--max-restarts", "3",
               "--log-dir", str(run_dir / "logs"), *system.flags, str(EXAMPLE), *job_args]
    elif family == "torchrun":
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(n),
               "--max-restarts", restarts, str(EXAMPLE), *job_args]
    elif family.startswith("torchft"):
        api = "--api=torchft-ddp" if family == "torchft-ddp" else "--api=torchft"
        cmd = [sys.executable, str(TORCHFT_DRIVER), "--replicas", str(n), "--max-restarts", restarts,
               "--timeout", str(args.torchft_timeout), str(PEER_RANK), api, *job_args]
    elif family == "nvrx":
        cmd = [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "--standalone",
               "--nproc-per-node", str(n), "--max-restarts", restarts, str(PEER_RANK), "--api=nvrx", *job_args]
    else:
        raise ValueError(f"unknown system family {family!r}")
    return Launch(cmd, env, run_dir / "console.log")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="2 ranks, a small model, 1 kill, only taskd live + warm spare and torchrun with the fix")
    add_job_arguments(p, reps=3)
    p.add_argument("--torchrun-max-restarts", type=int, default=3,
                   help="--max-restarts of torchrun, ft_launcher and each torchft replica's torchrun")
    p.add_argument("--torchft-timeout", type=int, default=5,
                   help="torchft's collective and Manager timeout, whole seconds (its train_ddp.py example's: 5); a "
                        "survivor blocked in an allreduce with a replica that already left waits it out")
    p.add_argument("--systems", default="", help="only these systems (comma-separated label prefixes)")
    p.add_argument("--lock", default="",
                   help="hold this flock(2) file while a size's references run and while one kill runs under every "
                        "system (a machine shared with other heavy jobs: they run between these chunks, not in one)")
    p.add_argument("--table", default="", metavar="RESULTS_JSON",
                   help="only print the tables of a stored result (bench/results/peers.json) and exit")
    args = p.parse_args()
    if args.table:
        return reprint(Path(args.table))
    if args.quick:
        args.ranks, args.reps, args.hidden, args.layers = "2", 1, 64, 2
        args.steps, args.ckpt_every, args.step_sleep = 16, 4, 0.1
        args.run_timeout, args.resume_timeout = min(args.run_timeout, 90.0), min(args.resume_timeout, 45.0)
    sizes = checked_sizes(p, args)
    if not sizes:
        return 2
    if args.systems:
        chosen = [s for s in SYSTEMS if any(s.label.startswith(x) for x in args.systems.split(","))]
    else:
        chosen = list(SYSTEMS)
    skipped = {s.label: why for s in chosen if (why := missing(s))}
    if args.quick and not args.systems:
        skipped.update({s.label: "not run by --quick (name it with --systems)" for s in chosen
                        if not s.quick and s.label not in skipped})
    for label, why in skipped.items():
        print(f"skipped: {label}: {why}", flush=True)
    systems = [s for s in chosen if s.label not in skipped]
    result = header("peers", args)
    result.update({"sizes": sizes, "reps": args.reps, "seed": args.seed, "steps": args.steps,
                   "ckpt_every": args.ckpt_every, "ckpt_async": args.ckpt_async, "hidden": args.hidden or None,
                   "layers": args.layers or None,
                   "systems": [s.label for s in systems], "skipped": skipped, "runs": [], "references": {},
                   "summary": {}})
    with tempfile.TemporaryDirectory(prefix="taskd-bench-peers-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            run_size(n, systems, args, work, result)
    result["rows"] = rows(result, systems, sizes)
    print_table(result)
    print_phases(result, [s.label for s in systems], sizes)
    write_result("peers", result)
    return 0


@contextlib.contextmanager
def held(path: str, result: dict[str, Any]) -> Iterator[None]:
    """flock(2) `path` for the block (nothing without a path); the load average is recorded when it is taken."""
    if not path:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        result.setdefault("loadavg_when_locked", []).append([round(x, 2) for x in os.getloadavg()])
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_size(n: int, systems: list[System], args: argparse.Namespace, work: Path, result: dict[str, Any]) -> None:
    refs: dict[str, Path] = {}
    with held(args.lock, result):
        for family in dict.fromkeys(s.family for s in systems):
            ref_dir = work / f"ref-{family}-{n}"
            ref = run_once(f"reference {family}", family, (), n, args, ref_dir, None, start)
            print(f"reference {family} {n} ranks: ok={ref['ok']} in {ref['seconds']:.1f}s", flush=True)
            result["references"][f"{family}/{n}"] = ref
            refs[family] = ref_dir / "out" / "final.pt"
    for rep in range(args.reps):
        with held(args.lock, result):  # every system under one kill sees the same machine
            run_kill(n, rep, systems, args, work, refs, result)
    summarize_size(n, systems, result)


def run_kill(n: int, rep: int, systems: list[System], args: argparse.Namespace, work: Path, refs: dict[str, Path],
             result: dict[str, Any]) -> None:
    kill = plan(args, n, rep)  # the same kill for every system
    for i, system in enumerate(systems):
        run_dir = work / f"run-{n}-{rep}-{i}"
        r = run_once(system.label, system.family, (system.label,), n, args, run_dir, kill, start)
        r["bit_identical"] = final_equal(run_dir / "out" / "final.pt", refs[system.family])
        result["runs"].append(r)
        print(f"{system.label} {n} ranks rep {rep}: kill rank {kill.victim} at step {kill.step}: "
              f"resumed {_s(r.get('resumed_s'))} s, recomputed {r.get('recomputed')}, "
              f"identical {r['bit_identical']}, leftovers {r.get('leftovers')}, ok {r['ok']}"
              + (f", error: {r['error']}" if r.get("error") else ""), flush=True)
        write_result("peers", result)  # partial results survive an interrupted run
        drop_checkpoints(args, run_dir)


def summarize_size(n: int, systems: list[System], result: dict[str, Any]) -> None:
    for system in systems:
        runs = [r for r in result["runs"] if r["config"] == system.label and r["ranks"] == n]
        s = summarize(runs)
        times = [r["resumed_s"] for r in runs if "resumed_s" in r]
        s["kill_to_resumed_s"]["min"] = min(times, default=None)
        checked = [r["leftovers"] for r in runs if r.get("leftovers") is not None]
        s["leftover_processes"] = sum(len(x) for x in checked) if checked else None
        s["leftovers_checked"] = len(checked)  # jobs whose launcher ended by itself
        s["errors"] = [r["error"] for r in runs if r.get("error")]
        for key in ("recomputed_survivors_max", "recomputed_victim"):  # per job, over the jobs: min, max
            vals = [r[key] for r in runs if r.get(key) is not None]
            s[f"{key}_range"] = [min(vals), max(vals)] if vals else None
        result["summary"][f"{system.label}/{n}"] = s


def reprint(path: Path) -> int:
    """The tables of a stored result, summarized again by this version of the script."""
    import json

    result = json.loads(path.read_text())
    systems = [BY_LABEL[label] for label in result["systems"]]
    for n in result["sizes"]:
        summarize_size(n, systems, result)
    result["rows"] = rows(result, systems, result["sizes"])
    print_table(result)
    print_phases(result, result["systems"], result["sizes"])
    return 0


def rows(result: dict[str, Any], systems: list[System], sizes: list[int]) -> list[dict[str, Any]]:
    """One row per system and size, with its ratio to taskd's best configuration that ran at that size (p50 / p50):
    the script-mode spare, else the warm spare."""
    out = []
    for n in sizes:
        base = next((p50 for label in (SCRIPT_SPARE, LIVE_SPARE)
                     if (p50 := result["summary"].get(f"{label}/{n}", {}).get("kill_to_resumed_s", {}).get("p50"))
                     is not None), None)
        for system in systems:
            s = result["summary"][f"{system.label}/{n}"]
            k = s["kill_to_resumed_s"]
            out.append({"system": system.label, "ranks": n, "resumed": s["resumed"], "runs": s["runs"],
                        "p50_s": k["p50"], "min_s": k["min"], "max_s": k["max"],
                        "redone_survivors_max": s["recomputed_survivors_max"],
                        "redone_killed_max": s["recomputed_victim_max"],
                        "redone_survivors": s["recomputed_survivors_max_range"],
                        "redone_killed": s["recomputed_victim_range"],
                        "survivors_kept_processes": s["survivors_kept_pid"],
                        "bit_identical": s["bit_identical"], "compared": s["compared"],
                        "leftovers": s["leftover_processes"], "leftovers_checked": s["leftovers_checked"],
                        "over_taskd_best": ratio(k["p50"], base)})
    return out


def print_table(result: dict[str, Any]) -> None:
    lines = [[r["system"], r["ranks"], f"{r['resumed']}/{r['runs']}", r["p50_s"], r["min_s"], r["max_s"],
              f"{_range(r['redone_survivors'])} / {_range(r['redone_killed'])}",
              f"{r['survivors_kept_processes']}/{r['resumed']}", f"{r['bit_identical']}/{r['compared']}",
              f"{_v(r['leftovers'])} ({r['leftovers_checked']})",
              "-" if r["over_taskd_best"] is None else f"{r['over_taskd_best']:.1f}×"]
             for r in result["rows"]]
    print("\nSIGKILL of one rank of examples/torch/train_ddp.py's DDP job → every rank past its next step")
    print(table(["system", "ranks", "resumed", "kill → resumed p50 s", "min s", "max s",
                 "steps redone: survivors / killed rank", "survivors kept their process", "bit-identical",
                 "leftovers (jobs checked)", "p50 / taskd's best (script-mode spare if run)"], lines, 2))
    for label, why in result["skipped"].items():
        print(f"skipped: {label}: {why}")


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _range(v: list[int] | None) -> str:
    return "-" if v is None else str(v[0]) if v[0] == v[1] else f"{v[0]}–{v[1]}"


def _v(v: Any) -> str:
    return "-" if v is None else str(v)


if __name__ == "__main__":
    sys.exit(main())
