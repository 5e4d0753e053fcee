"""Recovery of a sharded (HSDP) job side by side: the same model, the same seeded kills, one run.

The job is examples/torch/train_hsdp.py's: an MLP ``fully_shard``-ed over a 2-D mesh (2 replica groups x
ranks/2 shards, gloo on CPU), AdamW, the batch of step s a pure function of (seed, rank, s). Systems:

- taskd live HSDP with a spare that has run the script up to ``LiveGroup()`` (``--warm-spares 1
  --warm-spare-mode script``): only the killed rank is replaced; it receives its shards from the rank at the
  same shard coordinate in the other replica group. It writes no checkpoint (it needs none);
- taskd live pure FSDP2 (examples/torch/train_fsdp2_live.py, the same MLP sharded over every rank,
  ``LiveGroup(snapshot_every=1)``): the killed rank alone is replaced and restores its shards from its node's
  snapshot, the survivors roll back in place (at most 1 step redone); its shards are not compared with the
  HSDP reference (another sharding; tests/e2e/worker/test_live_fsdp.py checks them);
- taskd ``job-rescheduling``: every rank restarts from the newest ``torch.distributed.checkpoint`` (the
  example's ``--ckpt-dir``, every ``--ckpt-every`` steps);
- torchrun ``--max-restarts 3`` with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (as bench/peers.py runs it):
  the whole group restarts from the same checkpoints;
- torchft 0.2.0's HSDP (bench/sharded_torchft_rank.py, when torchft is importable): FSDP2 over each replica
  group's shards, the gradients averaged across replica groups by torchft's Manager; a dead rank takes its
  replica group out of the quorum until its torchrun has restarted it, and the group fetches the state from a
  healthy one. Its torchruns get ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` too (without it a restarted group's
  rank 1 read the dead rank 0's Manager address from the shared store and never connected), and its job runs
  ``--torchft-steps`` (3 x ``--steps``): the surviving group goes on alone at full speed, and a job that ended
  before the dead group was back would leave nothing to measure. Its shards are not compared (its average
  across groups is its own reduction, and the dead group's batches are missing).

The measure is bench/live_recovery.py's: a seeded rank SIGKILLed at a seeded point of a seeded step (the same
kill for every system), kill → every rank past its next step (the last rank's first step > S completed after
the kill, S the highest step any rank had completed then; steps redone do not count as progress). Each rank
appends ``STEP TIME PID`` per completed step to OUT/rank<R>.computed, every process that was that rank, so:
**steps redone** = lines - distinct steps (survivors and the killed rank apart); **samples never processed** =
(steps a rank never completed) x the batch, over every rank; **bit-identical**: every rank's final shards equal
to a fault-free taskd run's. The ratio column is torchrun's kill → resumed p50 over the system's.

And a planned migration (`taskd migrate`, no kill): the same HSDP job with a warm spare against a `taskd server`
(``--migrate-steps`` steps, so that the spare is ready while it trains; ``--step-sleep`` only until the rank has
moved, the rest at full speed); once every rank has completed 3 steps the
seeded victim rank is moved to the spare at the next step boundary (tried again while no spare is ready). Its
**pause** is the job event `migrated`'s `pause_seconds` (the first rank's end of the step before it to the last
rank's state synced in the new generation), set against the job's **step time** (the median gap between two
consecutive steps of one process, every rank's last 8 before the request); also its steps redone and whether the
other ranks kept their processes (its shards are compared by tests/e2e/agent/test_migrate_hsdp.py).

    python bench/sharded_live.py [--quick] [--ranks 4] [--reps 3] [--seed 1] [--steps 40] [--ckpt-every 10]
        [--hidden 256] [--systems PREFIX,...] [--migrate-steps 400] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    TASKD_DRIVER,
    TORCHRUN_DRIVER,
    bench_env,
    free_port,
    header,
    job_events,
    ratio,
    start_controller,
    stats,
    stop_process,
    table,
    wait_for,
    write_result,
)
from live_recovery import Kill, Launch, Progress, kill_and_watch, plan, step_time

EXAMPLE = ROOT / "examples" / "torch" / "train_hsdp.py"
FSDP2 = ROOT / "examples" / "torch" / "train_fsdp2_live.py"  # the same MLP, fully_shard over every rank
TORCHFT_RANK = Path(__file__).resolve().parent / "sharded_torchft_rank.py"
TORCHFT_DRIVER = Path(__file__).resolve().parent / "run_torchft.py"
TORCHRUN = "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (DCP)"


@dataclass(frozen=True)
class System:
    label: str
    family: str  # taskd, torchrun or torchft: how it is started
    flags: tuple[str, ...] = ()
    checkpoints: bool = True  # restarts from torch.distributed.checkpoint
    env: tuple[tuple[str, str], ...] = ()
    needs: str = ""
    comparable: bool = True  # its shards can equal taskd's reference (torchft averages across groups its own way)
    quick: bool = False  # run by --quick
    script: Path = EXAMPLE
    steps: int = 0  # the job's steps (0: --steps)
    sleep_while: str = ""  # --step-sleep only while this file exists


SYSTEMS: tuple[System, ...] = (
    System("taskd live HSDP + script-mode spare", "taskd",
           ("--strategies", "recover,job-rescheduling,exit", "--warm-spares", "1", "--warm-spare-mode", "script"),
           checkpoints=False, quick=True),
    System("taskd live FSDP2, snapshots k=1 + script-mode spare", "taskd",
           ("--strategies", "recover,job-rescheduling,exit", "--warm-spares", "1", "--warm-spare-mode", "script"),
           checkpoints=False, comparable=False, script=FSDP2),
    System("taskd job-rescheduling (DCP)", "taskd", ("--strategies", "job-rescheduling,exit")),
    System(TORCHRUN, "torchrun", env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),), quick=True),
    System("torchft 0.2.0 HSDP", "torchft", checkpoints=False, needs="torchft", comparable=False,
           env=(("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),)),  # a restarted group's rank 1 read rank 0's old address
)


def missing(system: System) -> str | None:
    if system.needs and importlib.util.find_spec(system.needs) is None:
        return f"{system.needs} is not installed in {sys.executable} (`pip install torchft==0.2.0`)"
    return None


def steps_of(system: System, args: argparse.Namespace) -> int:
    """torchft's job runs longer: its surviving group goes on alone at full speed, and a job that ends before the
    dead group's torchrun has restarted it would end with that group never back (nothing to measure)."""
    if system.steps:
        return system.steps
    return args.torchft_steps or 3 * args.steps if system.family == "torchft" else args.steps


def job_args(args: argparse.Namespace, run_dir: Path, system: System) -> list[str]:
    layout = ["--snapshot-every", "1"] if system.script == FSDP2 else ["--replicas", "2"]
    out = ["--steps", str(steps_of(system, args)), "--out", str(run_dir / "out"), *layout, "--hidden",
           str(args.hidden), "--layers", str(args.layers), "--batch", str(args.batch), "--seed", str(args.seed),
           "--pg-timeout", str(args.pg_timeout)]
    if system.checkpoints:
        out += ["--ckpt-dir", str(run_dir / "ckpt"), "--ckpt-every", str(args.ckpt_every)]
    if args.step_sleep:
        out += ["--step-sleep", str(args.step_sleep)]
    if system.sleep_while:
        out += ["--sleep-while", system.sleep_while]
    return out


def start(system: System, n: int, args: argparse.Namespace, run_dir: Path, max_restarts: int = 3,
          taskd_flags: Sequence[str] = ()) -> Launch:
    """Launch `system`'s job of `n` ranks. bench/goodput.py starts the same systems (its --job hsdp) with a larger
    restart budget (it injects many faults) and taskd's --heartbeat-timeout (`taskd_flags`: it injects hangs)."""
    run_dir.mkdir(parents=True)
    env = bench_env(BENCH_EVENTS=str(run_dir / "agent.jsonl"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                    **dict(system.env))
    if system.family != "taskd":
        env = {k: v for k, v in env.items() if not k.startswith("TASKD_")}
    script = job_args(args, run_dir, system)
    if system.family == "taskd":
        cmd = [sys.executable, str(TASKD_DRIVER), "--nproc-per-node", str(n), "--max-restarts", str(max_restarts),
               "--log-dir", str(run_dir / "logs"), *taskd_flags, *system.flags, str(system.script), *script]
    elif system.family == "torchrun":
        cmd = [sys.executable, str(TORCHRUN_DRIVER), "--standalone", "--nproc-per-node", str(n),
               "--max-restarts", str(max_restarts), str(EXAMPLE), *script]
    elif system.family == "torchft":  # one torchrun of n/2 ranks per replica group, a Lighthouse
        cmd = [sys.executable, str(TORCHFT_DRIVER), "--replicas", "2", "--nproc-per-replica", str(n // 2),
               "--min-replicas", "1", "--max-restarts", str(max_restarts), "--timeout", str(args.torchft_timeout),
               str(TORCHFT_RANK), *script]
    else:
        raise ValueError(f"unknown family {system.family!r}")
    return Launch(cmd, env, run_dir / "console.log")


def run_once(system: System, n: int, args: argparse.Namespace, run_dir: Path, kill: Kill | None) -> dict[str, Any]:
    """One job from start to end, with at most one kill; every wait is bounded; nothing left running."""
    t0 = time.time()
    job = start(system, n, args, run_dir)
    prog = Progress(run_dir / "out", n, name="rank{}.computed")
    res: dict[str, Any] = {"system": system.label, "ranks": n, "kill": None if kill is None else vars(kill),
                           "ok": False}
    try:
        if kill is not None:
            res.update(kill_and_watch(job, prog, kill, n, args))
        wait_for(lambda: (job.look(), job.proc.poll() is not None)[1], args.run_timeout - (time.time() - t0),
                 "the job to end", 0.05)
        res["rc"] = job.proc.returncode
        res["ok"] = job.proc.returncode == 0
        res["leftovers"] = job.leftovers()
    except (TimeoutError, RuntimeError) as exc:
        res["error"] = str(exc)
    finally:
        job.close()
    res["seconds"] = time.time() - t0
    res.update(account(run_dir / "out", n, steps_of(system, args), args.batch, kill))
    return res


MIGRATION = "taskd migrate of one rank (planned), HSDP + spare"


def migrate_once(n: int, args: argparse.Namespace, run_dir: Path, rank: int) -> dict[str, Any]:
    """One fault-free HSDP job with a warm spare against a `taskd server`; `taskd migrate` of `rank` once every rank
    has completed 3 steps. Every wait is bounded; nothing left running."""
    run_dir.mkdir(parents=True)
    port = free_port()
    ctl = start_controller(port, log=run_dir / "controller.log")
    address, job_id, pace = f"127.0.0.1:{port}", f"migrate-{n}", run_dir / "pace"
    pace.touch()  # paced (--step-sleep) until moved, then the rest of its steps at full speed
    system = System(MIGRATION, "taskd", ("--server", address, "--job-id", job_id, "--warm-spares", "1"),
                    checkpoints=False, steps=args.migrate_steps, sleep_while=str(pace))
    t0 = time.time()
    res: dict[str, Any] = {"system": MIGRATION, "ranks": n, "rank": rank, "ok": False}
    job = None
    try:
        job = start(system, n, args, run_dir / "job")
        prog = Progress(run_dir / "job" / "out", n, name="rank{}.computed")
        ended = lambda: (job.look(), job.proc.poll() is not None)[1]  # noqa: E731
        wait_for(lambda: ended() or all(len(prog.poll().get(r, [])) >= 3 for r in range(n)),
                 args.run_timeout, "every rank's first 3 steps", 0.05)
        before = {r: prog.records[r][-1][2] for r in range(n) if prog.records.get(r)}
        asked = time.time()
        done = wait_for(lambda: "ended" if ended() else _migrated(address, job_id, rank) and "moved",
                        args.resume_timeout, "a migration with a ready spare", 0.5)
        res["step_s"] = step_time(prog.poll(), asked)
        if done == "ended":
            raise RuntimeError(f"the job ended before rank {rank} was moved (--migrate-steps {args.migrate_steps})")
        res["migrate_s"] = time.time() - asked
        pace.unlink()
        wait_for(ended, args.run_timeout - (time.time() - t0), "the job to end", 0.05)
        res["rc"] = job.proc.returncode
        res["leftovers"] = job.leftovers()
        res["ok"] = job.proc.returncode == 0 and not res["leftovers"]
        event = next((e["detail"] for e in job_events(address, job_id) if e["kind"] == "migrated"), None)
        if event is not None:
            res.update(pause_s=event["pause_seconds"], step=event["step"], old_pid=event["old_pid"])
            res["survivors_kept_pid"] = all({p for *_, p in prog.poll()[r]} == {before[r]} for r in range(n)
                                            if r != rank)
    except (TimeoutError, RuntimeError) as exc:
        res["error"] = str(exc)
    finally:
        if job is not None:
            job.close()
        stop_process(ctl)
    res["seconds"] = time.time() - t0
    res["pause_over_step"] = ratio(res.get("pause_s"), res.get("step_s"))
    res.update(account(run_dir / "job" / "out", n, args.migrate_steps, args.batch, None))
    return res


def _migrated(address: str, job_id: str, rank: int) -> bool:
    """`taskd migrate` of the rank: True once it moved; False while the node's warm spare is not ready yet."""
    done = subprocess.run([sys.executable, "-m", "taskd", "migrate", "--server", address, "--job", job_id, "--rank",
                           str(rank), "--timeout", "100"], capture_output=True, text=True, timeout=150, cwd=ROOT,
                          env=bench_env())
    if done.returncode == 0:
        return True
    if "no warm spare is ready" in done.stderr:
        return False
    raise RuntimeError(f"taskd migrate: {done.stderr.strip() or done.stdout.strip()}")


def account(out: Path, n: int, total: int, batch: int, kill: Kill | None) -> dict[str, Any]:
    """Steps redone and samples never processed, from every rank's ``STEP TIME PID`` lines."""
    redone, never = {}, 0
    for r in range(n):
        path = out / f"rank{r}.computed"
        steps = [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []
        redone[r] = len(steps) - len(set(steps))
        never += len(set(range(total)) - set(steps)) * batch
    victim = None if kill is None else kill.victim
    return {"redone": redone, "redone_survivors_max": max((v for r, v in redone.items() if r != victim), default=0),
            "redone_victim": None if victim is None else redone[victim], "samples_never_processed": never}


def identical(out: Path, ref: Path, n: int) -> bool | None:
    """Whether every rank's final shards equal the reference run's; None where a rank wrote none."""
    return same_shards([(out / f"rank{r}.pt", ref / f"rank{r}.pt") for r in range(n)])


def same_shards(files: list[tuple[Path, Path]]) -> bool | None:
    """Whether each pair of shard files holds equal tensors; None where a file is missing."""
    import torch

    if not all(a.exists() and b.exists() for a, b in files):
        return None
    for a, b in files:
        x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
        if set(x) != set(y) or not all(torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 ranks, a small model, 1 kill, taskd live and torchrun "
                   "(torchft's surviving group would finish so short a job before the dead one is back)")
    p.add_argument("--ranks", default="4", help="ranks per job (even: 2 replica groups), comma-separated")
    p.add_argument("--reps", type=int, default=3, help="kills per system and size")
    p.add_argument("--seed", type=int, default=1, help="seeds the kills (step, rank, point in the step)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10, help="DCP checkpoint interval of the restarting systems")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--torchft-timeout", type=int, default=5, help="torchft's collective and Manager timeout (s)")
    p.add_argument("--torchft-steps", type=int, default=0, help="torchft's job's steps (0: 3 x --steps)")
    p.add_argument("--migrate-steps", type=int, default=1000, help="the migrated job's steps (its spare must be "
                   "ready before it ends)")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds one job may take in all")
    p.add_argument("--resume-timeout", type=float, default=120.0, help="seconds from the kill to resumed")
    p.add_argument("--systems", default="", help="only these systems (comma-separated label prefixes)")
    p.add_argument("--keep", default="", help="keep every job's files under this directory")
    p.add_argument("--table", default="", metavar="RESULTS_JSON", help="only print the table of a stored result")
    args = p.parse_args()
    if args.table:
        import json

        result = json.loads(Path(args.table).read_text())
        result["rows"] = rows(result, [s for s in SYSTEMS if s.label in result["systems"]], result["sizes"])
        print_table(result)
        return 0
    if args.quick:
        args.ranks, args.reps, args.hidden, args.layers, args.steps, args.ckpt_every = "4", 1, 32, 2, 12, 4
        args.step_sleep, args.run_timeout, args.resume_timeout = 0.05, min(args.run_timeout, 90.0), 45.0
        args.migrate_steps = 300
    sizes = [int(s) for s in args.ranks.split(",") if s]
    if not sizes or any(s < 4 or s % 2 for s in sizes) or args.reps < 1 or args.steps < 8 or args.ckpt_every < 1:
        p.error("--ranks: even sizes >= 4; --reps >= 1, --steps >= 8, --ckpt-every >= 1")
    chosen = [s for s in SYSTEMS if not args.systems or any(s.label.startswith(x) for x in args.systems.split(","))]
    migrating = not args.systems or any(MIGRATION.startswith(x) for x in args.systems.split(","))
    skipped = {s.label: why for s in chosen if (why := missing(s))}
    if args.quick and not args.systems:
        skipped.update({s.label: "not run by --quick (name it with --systems)" for s in chosen
                        if s.label not in skipped and not s.quick})
    for label, why in skipped.items():
        print(f"skipped: {label}: {why}", flush=True)
    systems = [s for s in chosen if s.label not in skipped]
    result = header("sharded_live", args)
    result.update({"sizes": sizes, "reps": args.reps, "seed": args.seed, "steps": args.steps,
                   "ckpt_every": args.ckpt_every, "hidden": args.hidden, "layers": args.layers, "batch": args.batch,
                   "systems": [s.label for s in systems], "skipped": skipped, "runs": [], "references": {},
                   "migrate_steps": args.migrate_steps, "migrations": []})
    with tempfile.TemporaryDirectory(prefix="taskd-bench-sharded-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            ref_dir = work / f"ref-{n}"
            if systems:  # the kills' reference (the migration's shards are compared by its e2e test)
                ref = run_once(System("reference", "taskd", checkpoints=False), n, args, ref_dir, None)
                print(f"reference (taskd, no fault) {n} ranks: ok={ref['ok']} in {ref['seconds']:.1f}s", flush=True)
                result["references"][str(n)] = ref
            for rep in range(args.reps if systems else 0):
                kill = plan(args, n, rep)  # the same kill for every system
                for i, system in enumerate(systems):
                    run_dir = work / f"run-{n}-{rep}-{i}"
                    r = run_once(system, n, args, run_dir, kill)
                    r["bit_identical"] = identical(run_dir / "out", ref_dir / "out", n) if system.comparable else None
                    result["runs"].append(r)
                    print(f"{system.label} {n} ranks rep {rep}: kill rank {kill.victim} at step {kill.step}: resumed "
                          f"{_f(r.get('resumed_s'))} s, redone {r['redone']}, never processed "
                          f"{r['samples_never_processed']}, identical {r['bit_identical']}, ok {r['ok']}"
                          + (f", error: {r['error']}" if r.get("error") else ""), flush=True)
                    write_result("sharded_live", result)
                    if not args.keep:
                        shutil.rmtree(run_dir / "ckpt", ignore_errors=True)
            for rep in range(args.reps if migrating else 0):
                m = migrate_once(n, args, work / f"migrate-{n}-{rep}", plan(args, n, rep).victim)
                result["migrations"].append(m)
                print(f"{MIGRATION} {n} ranks rep {rep}: rank {m['rank']} paused the job {_f(m.get('pause_s'))} s, "
                      f"a step takes {_f(m.get('step_s'))} s, redone {m['redone']}, ok {m['ok']}"
                      + (f", error: {m['error']}" if m.get("error") else ""), flush=True)
                write_result("sharded_live", result)
    result["rows"] = rows(result, systems, sizes)
    print_table(result)
    write_result("sharded_live", result)
    return 0


def rows(result: dict[str, Any], systems: list[System], sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        by = {s.label: [r for r in result["runs"] if r["system"] == s.label and r["ranks"] == n] for s in systems}
        p50 = {label: stats([r["resumed_s"] for r in runs if "resumed_s" in r])["p50"] for label, runs in by.items()}
        for s in systems:
            runs = by[s.label]
            k = stats([r["resumed_s"] for r in runs if "resumed_s" in r])
            out.append({"system": s.label, "ranks": n, "runs": len(runs),
                        "resumed": sum(1 for r in runs if "resumed_s" in r), "p50_s": k["p50"], "max_s": k["max"],
                        "step_s": stats([r["step_s"] for r in runs if r.get("step_s")])["p50"],
                        "redone_survivors_max": max((r["redone_survivors_max"] for r in runs), default=None),
                        "redone_victim_max": max((r["redone_victim"] or 0 for r in runs), default=None),
                        "samples_never_processed": sum(r["samples_never_processed"] for r in runs if r["ok"]),
                        "survivors_kept_pid": sum(1 for r in runs if r.get("survivors_kept_pid")),
                        "bit_identical": sum(1 for r in runs if r.get("bit_identical")),
                        "compared": sum(1 for r in runs if r.get("bit_identical") is not None),
                        "torchrun_over_this": ratio(p50.get(TORCHRUN), k["p50"])})
    return out


def migration_rows(result: dict[str, Any]) -> list[list[Any]]:
    out = []
    for n in result["sizes"]:
        runs = [m for m in result.get("migrations", []) if m["ranks"] == n]
        if runs:
            moved = [m for m in runs if m.get("pause_s") is not None]
            pause, step = stats([m["pause_s"] for m in moved]), stats([m["step_s"] for m in moved if m.get("step_s")])
            out.append([MIGRATION, n, f"{len(moved)}/{len(runs)}", pause["p50"], pause["max"], step["p50"],
                        stats([m["pause_over_step"] for m in moved if m.get("pause_over_step")])["p50"],
                        max((m["redone_survivors_max"] for m in runs), default=None),
                        f"{sum(1 for m in moved if m.get('survivors_kept_pid'))}/{len(moved)}"])
    return out


def print_table(result: dict[str, Any]) -> None:
    lines = [[r["system"], r["ranks"], f"{r['resumed']}/{r['runs']}", r["p50_s"], r["max_s"], r["step_s"],
              f"{_v(r['redone_survivors_max'])} / {_v(r['redone_victim_max'])}", r["samples_never_processed"],
              f"{r['survivors_kept_pid']}/{r['resumed']}",
              f"{r['bit_identical']}/{r['compared']}" if r["compared"] else "n/a",
              "-" if r["torchrun_over_this"] is None else f"{r['torchrun_over_this']:.1f}×"]
             for r in result["rows"]]
    if result["rows"]:
        print(f"\nSIGKILL of one rank of examples/torch/train_hsdp.py's HSDP job (2 replica groups, {result['steps']} "
              f"steps; the FSDP2 row: train_fsdp2_live.py's, the same MLP) → every rank past its next step")
        print(table(["system", "ranks", "resumed", "kill → resumed p50 s", "max s", "step s",
                     "steps redone max: survivors / killed rank", "samples never processed (jobs that ended)",
                     "survivors kept their process",
                     "bit-identical", "torchrun p50 / this p50"], lines, 2))
    if migrations := migration_rows(result):
        load = result["machine"]["loadavg_at_start"][0]
        print(f"\nA planned migration of one rank (`taskd migrate`, {result['migrate_steps']} steps, load "
              f"{load:.1f} at the start{'' if load < 1.5 else ': loaded'}) → the job's pause against one step")
        print(table(["system", "ranks", "migrated", "pause p50 s", "max s", "step s p50", "pause / step p50",
                     "steps redone max", "other ranks kept their process"], migrations, 3))
    for label, why in result["skipped"].items():
        print(f"skipped: {label}: {why}")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _v(v: Any) -> str:
    return "-" if v is None else str(v)


if __name__ == "__main__":
    sys.exit(main())
