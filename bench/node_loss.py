"""Node loss in a 2-node DDP job: SIGKILL of node 1's whole launcher to every rank past its next step.

examples/torch/train_ddp.py (DDP over gloo, LiveGroup), 2 nodes of 2 ranks on this machine, under:

- **taskd live + replacement**: one `taskd server`, two `taskd run --nnodes 2 --node-rank R --server ...`;
  node 1's `taskd run` (agent and ranks, its process group) is SIGKILLed and a replacement
  `taskd run --node-rank 1` is started 2 s later: the survivors keep their processes, the new ranks
  join the next generation and receive the state from them;
- **taskd job-rescheduling + replacement**: the same with `--strategies job-rescheduling,exit`: every
  rank of both nodes restarts from its newest checkpoint once the replacement is there;
- **torchrun restart**: two `torchrun --nnodes 2 --rdzv-backend c10d` (node 0 hosts the rendezvous
  store, `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, `--max-restarts`); node 1's torchrun is SIGKILLed and
  started again 2 s later: node 0 restarts its workers and the group re-forms from checkpoints;
- **taskd live + standby**: a `taskd run --standby` started with the job takes the lost node over by
  itself, if the controller assigns standbys (else: "standby: skipped"); **+ warm standby**: the same
  with `--warm-spares 2`, so the standby's first ranks are interpreters that imported torch while it waited.

The measure is bench/live_recovery.py's (its progress files and `Launch`): every rank appends
`STEP TIME PID` at each completed step; S is the highest step any rank had completed at the kill,
resumed is when the last rank completes a step > S. Also: steps recomputed per rank (summary.json),
whether the survivors kept their pids, final.pt bit-identical to a fault-free run of the same
launcher, every node's exit code, processes of the job left behind, and the controller's
`node_lost`/`node_replaced` times.

    python bench/node_loss.py [--quick] [--reps 3] [--steps 30] [--seed 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import (
    TASKD_DRIVER,
    TORCHRUN_DRIVER,
    bench_env,
    free_port,
    has_torch,
    header,
    job_events,
    start_controller,
    stats,
    stop_process,
    table,
    wait_for,
    write_result,
)
from live_recovery import EXAMPLE, Launch, Progress, example_args, final_equal

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
LOST = 1  # the node killed
LOST_RANKS = tuple(range(LOST * PER_NODE, (LOST + 1) * PER_NODE))
REPLACEMENT_DELAY = 2.0  # the scenario: a replacement started 2 s after the loss
GRACE = 5.0  # --agent-loss-grace, taskd server's default: a stream ended this long ago is a lost node (--grace)

# (label, family, extra launcher flags)
CONFIGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("taskd live + replacement", "taskd", ("--strategies", "recover,job-rescheduling,exit")),
    ("taskd job-rescheduling + replacement", "taskd", ("--strategies", "job-rescheduling,exit")),
    ("torchrun restart", "torchrun", ()),
    ("taskd live + standby", "standby", ("--strategies", "recover,job-rescheduling,exit")),
    # the standby's spare interpreters have imported torch while it waited (--warm-spares: its first ranks)
    ("taskd live + warm standby", "standby", ("--strategies", "recover,job-rescheduling,exit", "--warm-spares", "2")),
)
NO_STANDBY = "standby: skipped (controller has no standby support)"


class Job:
    """One 2-node job: its controller (taskd), its nodes, and the kill of node 1."""

    def __init__(self, label: str, family: str, flags: tuple[str, ...], args: argparse.Namespace,
                 run_dir: Path) -> None:
        self.label, self.family, self.flags, self.args, self.dir = label, family, flags, args, run_dir
        run_dir.mkdir(parents=True)
        self.job_id = f"nl-{run_dir.name}"
        self.master = free_port()  # taskd: the agent-side store; torchrun: the c10d rendezvous endpoint
        self.controller = None
        self.address = ""
        if family != "torchrun":
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            self.controller = start_controller(port, log=run_dir / "server.log", extra=[
                "--agent-loss-grace", str(args.grace), "--node-rejoin-timeout", "120"])
        self.nodes: dict[str, Launch] = {}

    def start(self, name: str, node_rank: int | None) -> Launch:
        """Node `node_rank` (None: a standby) of the job, its console in NAME.log, its agent's records in NAME.jsonl."""
        env = bench_env(BENCH_EVENTS=str(self.dir / f"{name}.jsonl"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        if self.family == "torchrun":
            env = {k: v for k, v in env.items() if not k.startswith("TASKD_")}
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            cmd = [sys.executable, str(TORCHRUN_DRIVER), "--nnodes", str(NODES), "--nproc-per-node", str(PER_NODE),
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.master}", "--rdzv-id", self.job_id,
                   "--rdzv-conf", f"is_host={'true' if node_rank == 0 else 'false'}",
                   "--max-restarts", str(self.args.torchrun_max_restarts), "--monitor-interval", "0.2"]
        else:
            where = ["--standby"] if node_rank is None else ["--node-rank", str(node_rank)]
            cmd = [sys.executable, str(TASKD_DRIVER), "--nnodes", str(NODES), *where, "--nproc-per-node",
                   str(PER_NODE), "--server", self.address, "--job-id", self.job_id, "--master-addr", "127.0.0.1",
                   "--master-port", str(self.master), "--max-restarts", "3", "--monitor-interval", "0.2",
                   "--log-dir", str(self.dir / "logs" / name), *self.flags]
        launch = Launch([*cmd, str(EXAMPLE), *example_args(self.args, self.dir)], env, self.dir / f"{name}.log")
        self.nodes[name] = launch
        return launch

    def standby_listed(self, timeout: float) -> bool:
        """Whether the controller lists a standby agent of the job within `timeout` (it supports standbys)."""
        import grpc

        from taskd.proto import taskd_pb2, taskd_pb2_grpc

        def listed() -> bool:
            with grpc.insecure_channel(self.address) as ch:
                reply = taskd_pb2_grpc.JobStatusStub(ch).ListJobs(taskd_pb2.JobQuery(jobId=self.job_id), timeout=5)
            return bool(reply.jobs) and any(a.standby for a in reply.jobs[0].agents)

        try:
            return bool(wait_for(listed, timeout, "the controller to list the standby", 0.5))
        except (TimeoutError, grpc.RpcError):
            return False

    def leftovers(self) -> list[int]:
        """Live processes whose command line names this job's run directory."""
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and any(str(self.dir) in a
                                                                      for a in proc.info["cmdline"] or []):
                    found.append(proc.pid)
            except psutil.Error:
                continue
        return found

    def close(self) -> None:
        for launch in self.nodes.values():
            launch.close()
        stop_process(self.controller)


def run_once(label: str, family: str, flags: tuple[str, ...], args: argparse.Namespace, run_dir: Path,
             kill_step: int | None) -> dict[str, Any]:
    """One job from start to end, with at most one node loss; every wait is bounded."""
    t0 = time.time()
    job = Job(label, family, flags, args, run_dir)
    res: dict[str, Any] = {"config": label, "kill_step": kill_step, "ok": False}
    progress = Progress(run_dir / "progress", WORLD)
    try:
        for n in range(NODES):
            job.start(f"node{n}", n)
        if family == "standby":
            job.start("standby", None)
            if not job.standby_listed(30.0):
                res["skipped"] = NO_STANDBY
                return res
        if kill_step is not None:
            res.update(kill_node(job, progress, kill_step, args))
        survivors = {k: v for k, v in job.nodes.items() if k != f"node{LOST}" or kill_step is None}
        deadline = t0 + args.run_timeout
        for launch in survivors.values():
            wait_for(lambda launch=launch: (launch.look(), launch.proc.poll() is not None)[1],
                     max(1.0, deadline - time.time()), "every node to end", 0.05)
        res["exit_codes"] = {k: v.proc.returncode for k, v in survivors.items()}
        res["ok"] = set(res["exit_codes"].values()) == {0} and (run_dir / "out" / "final.pt").exists()
        try:
            wait_for(lambda: not job.leftovers(), 15, "no process of the job left", 0.2)
            res["leftovers"] = 0
        except TimeoutError:
            res["leftovers"] = len(job.leftovers())
        if job.address and kill_step is not None:
            res["controller_s"] = controller_times(job, res.get("t_kill"))
    except (TimeoutError, RuntimeError) as exc:
        res["error"] = str(exc)
    finally:
        job.close()
    res["seconds"] = time.time() - t0
    summary_path = run_dir / "out" / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        res["recomputed"] = {int(r): v for r, v in summary["recomputed"].items()}
    return res


def kill_node(job: Job, progress: Progress, step: int, args: argparse.Namespace) -> dict[str, Any]:
    """SIGKILL node 1's launcher and every process under it once its first rank reached `step`; start its
    replacement (a standby takes over by itself) 2 s later; return when every rank completed a step past the loss."""
    victim = job.nodes[f"node{LOST}"]

    def reached() -> bool:
        for launch in job.nodes.values():
            launch.look()
            if launch.proc.poll() is not None:
                raise RuntimeError(f"a node ended (rc {launch.proc.returncode}) before step {step}")
        recs = progress.poll().get(LOST_RANKS[0], [])
        return bool(recs) and recs[-1][0] >= step

    wait_for(reached, args.run_timeout, f"rank {LOST_RANKS[0]} to reach step {step}", 0.003)
    time.sleep(args.step_sleep / 2)  # in the middle of the next step, not at its boundary
    first_pids = {r: recs[0][2] for r, recs in progress.poll().items()}
    whole = node_processes(victim.proc.pid)
    t_kill = time.time()
    for proc in whole:  # the node is gone: its launcher and every process under it at once
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    victim.proc.wait(10)
    done_before = max(s for recs in progress.poll().values() for s, t, _ in recs if t <= t_kill)
    if job.family != "standby":
        time.sleep(max(0.0, t_kill + REPLACEMENT_DELAY - time.time()))
        job.start("replacement", LOST)

    def resumed() -> dict[int, tuple[int, float, int]] | None:
        for name, launch in job.nodes.items():
            launch.look()
            if name != f"node{LOST}" and launch.proc.poll() is not None:
                raise RuntimeError(f"{name} ended (rc {launch.proc.returncode}) before training resumed")
        recs = progress.poll()
        first = {r: next((x for x in recs.get(r, []) if x[0] > done_before and x[1] > t_kill), None)
                 for r in range(WORLD)}
        return first if all(first.values()) else None  # type: ignore[return-value]

    first = wait_for(resumed, args.resume_timeout, "every rank past its next step", 0.01)
    survivors = [r for r in range(WORLD) if r not in LOST_RANKS]
    return {"t_kill": t_kill, "done_before_kill": done_before,
            "resumed_s": max(t for _, t, _ in first.values()) - t_kill,
            "survivors_kept_pid": all(first[r][2] == first_pids[r] for r in survivors),
            "replacement_first_step_s": min(first[r][1] for r in LOST_RANKS) - t_kill}


def node_processes(pid: int) -> list[psutil.Process]:
    """A launcher and every process under it (ranks may sit in process groups of their own, as torchrun's do)."""
    try:
        launcher = psutil.Process(pid)
        return [launcher, *launcher.children(recursive=True)]
    except psutil.Error:
        return []


def controller_times(job: Job, t_kill: float | None) -> dict[str, float]:
    """Seconds from the kill to the controller's node-loss events (its own clock; same machine)."""
    if t_kill is None:
        return {}
    out: dict[str, float] = {}
    try:
        for e in job_events(job.address, job.job_id):
            if e["kind"] in ("node_lost", "node_replaced", "round_ended") and e["kind"] not in out \
                    and e["time"] >= t_kill - 1:
                out[e["kind"]] = round(e["time"] - t_kill, 3)
    except Exception as exc:  # noqa: BLE001 - the figures above stand without these
        out["error"] = str(exc)  # type: ignore[assignment]
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "resumed_s" in r]
    recomputed: dict[int, list[int]] = {}
    for r in runs:
        for rank, v in (r.get("recomputed") or {}).items():
            recomputed.setdefault(rank, []).append(v)
    phases: dict[str, list[float]] = {}
    for r in ok:
        for k, v in (r.get("controller_s") or {}).items():
            if isinstance(v, float):
                phases.setdefault(k, []).append(v)
        phases.setdefault("replacement_first_step", []).append(r["replacement_first_step_s"])
    resumed = [r["resumed_s"] for r in ok]
    return {
        "runs": len(runs), "resumed": len(ok), "completed": sum(1 for r in runs if r["ok"]),
        "kill_to_resumed_s": {**stats(resumed), "min": min(resumed, default=None)},
        "recomputed_per_rank": {r: recomputed[r] for r in sorted(recomputed)},
        "survivors_kept_pid": sum(1 for r in ok if r.get("survivors_kept_pid")),
        "bit_identical": sum(1 for r in runs if r.get("bit_identical")),
        "compared": sum(1 for r in runs if r.get("bit_identical") is not None),
        "leftovers": sum(r.get("leftovers", 0) for r in runs),
        "phases_p50_s": {k: stats(v)["p50"] for k, v in phases.items()},
    }


def print_tables(result: dict[str, Any]) -> None:
    rows, phase_rows = [], []
    for label, s in result["summary"].items():
        k = s["kill_to_resumed_s"]
        per_rank = ", ".join(f"{r}: {'/'.join(map(str, v))}" for r, v in s["recomputed_per_rank"].items())
        grace = "-" if label.startswith("torchrun") else result.get("grace", GRACE)
        rows.append([label, grace, f"{s['resumed']}/{s['runs']}", k["p50"], k["min"], k["max"], per_rank or "-",
                     f"{s['survivors_kept_pid']}/{s['resumed']}", f"{s['bit_identical']}/{s['compared']}",
                     f"{s['completed']}/{s['runs']}", s["leftovers"]])
        ph = s["phases_p50_s"]
        phase_rows.append([label, *(ph.get(x) for x in ("node_lost", "node_replaced", "round_ended",
                                                        "replacement_first_step"))])
    print(f"\nNode loss, {NODES} nodes x {PER_NODE} ranks of examples/torch/train_ddp.py: SIGKILL of node {LOST}'s "
          "launcher to every rank past its next step")
    print(table(["configuration", "loss grace s", "resumed", "kill → resumed p50 s", "min s", "max s",
                 "steps recomputed per rank (each kill)", "survivors kept pids", "bit-identical",
                 "every node exit 0", "processes left"], rows, 2))
    print("\nPhases, seconds after the kill (p50; the controller's events, the new ranks' progress files)")
    print(table(["configuration", "declared lost", "replacement registered", "round ended",
                 "new node's first step"], phase_rows, 2))
    for note in result.get("notes", []):
        print(note)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 kill per configuration: checks the script works")
    p.add_argument("--reps", type=int, default=3, help="kills per configuration")
    p.add_argument("--seed", type=int, default=1, help="seeds the step of each kill")
    p.add_argument("--steps", type=int, default=30, help="training steps per job")
    p.add_argument("--ckpt-every", type=int, default=5, help="the example's checkpoint interval (steps)")
    p.add_argument("--hidden", type=int, default=256, help="the example's --hidden")
    p.add_argument("--layers", type=int, default=2, help="the example's --layers")
    p.add_argument("--step-sleep", type=float, default=0.05, help="the example's --step-sleep")
    p.add_argument("--pg-timeout", type=float, default=60.0, help="the example's collective timeout (s)")
    p.add_argument("--torchrun-max-restarts", type=int, default=3, help="torchrun's --max-restarts")
    p.add_argument("--configs", default="", help="only these configurations (comma-separated label prefixes)")
    p.add_argument("--run-timeout", type=float, default=150.0, help="seconds one job may take in all")
    p.add_argument("--resume-timeout", type=float, default=90.0, help="seconds from the kill to resumed")
    p.add_argument("--keep", default="", help="keep every job's files under this directory")
    p.add_argument("--grace", type=float, default=GRACE,
                   help="taskd server's --agent-loss-grace (s): the default is the controller's own")
    args = p.parse_args()
    if args.quick:
        args.reps = 1
    if args.reps < 1 or args.steps < 12 or args.ckpt_every < 1:
        p.error("--reps >= 1, --steps >= 12, --ckpt-every >= 1")
    if not has_torch():
        print("torch is not installed: this benchmark needs it (`pip install torch==2.13.0`, a CPU build)")
        return 2
    configs = [c for c in CONFIGS if not args.configs or any(c[0].startswith(x) for x in args.configs.split(","))]
    result = header("node_loss", args)
    result.update({"nodes": NODES, "ranks_per_node": PER_NODE, "reps": args.reps, "steps": args.steps,
                   "grace": args.grace,
                   "configs": [c[0] for c in configs], "runs": [], "references": {}, "summary": {}, "notes": []})
    rng = random.Random(args.seed)
    # a kill never right after a checkpoint (a restart from it would then recompute nothing, by luck)
    steps = [s for s in range(args.steps // 4, args.steps // 2 + 1) if (s + 1) % args.ckpt_every not in (0, 1)]
    kills = [rng.choice(steps) for _ in range(args.reps)]
    with tempfile.TemporaryDirectory(prefix="taskd-bench-node-loss-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        refs: dict[str, Path] = {}
        for family in sorted({"taskd" if c[1] == "standby" else c[1] for c in configs}):
            flags = next(c[2] for c in configs if c[1] in (family, "standby"))
            ref = run_once(f"reference {family}", family, flags, args, work / f"ref-{family}", None)
            print(f"reference {family}: ok={ref['ok']} in {ref['seconds']:.1f}s", flush=True)
            result["references"][family] = ref
            refs[family] = work / f"ref-{family}" / "out" / "final.pt"
        for i, (label, family, flags) in enumerate(configs):
            runs = []
            for rep, step in enumerate(kills):
                run_dir = work / f"run-{i}-{rep}"
                r = run_once(label, family, flags, args, run_dir, step)
                if r.get("skipped"):
                    print(r["skipped"], flush=True)
                    result["notes"].append(r["skipped"])
                    break
                r["bit_identical"] = final_equal(run_dir / "out" / "final.pt",
                                                 refs["taskd" if family == "standby" else family])
                runs.append(r)
                result["runs"].append(r)
                print(f"{label} rep {rep}: node {LOST} killed at step {step}: resumed "
                      f"{r.get('resumed_s', float('nan')):.2f}s, recomputed {r.get('recomputed')}, identical "
                      f"{r['bit_identical']}, exits {r.get('exit_codes')}, left {r.get('leftovers')}, ok {r['ok']}"
                      + (f", error: {r['error']}" if r.get("error") else ""), flush=True)
                write_result("node_loss", result)  # partial results survive an interrupted run
            if runs:
                result["summary"][label] = summarize(runs)
    print_tables(result)
    write_result("node_loss", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
