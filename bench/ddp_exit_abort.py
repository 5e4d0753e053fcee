"""How often a finished DDP job over gloo fails at its end under plain torchrun, by how the script ends.

A gloo worker that needs the GIL once the interpreter is finalizing aborts the rank (``SIGABRT``, "terminate
called without an active exception"). Two things make a worker need it then. torch 2.13's
DistributedDataParallel keeps its gloo group alive past ``destroy_process_group``, so the group is freed while the
interpreter finalizes, joining its workers there: ``live.close()`` therefore keeps every group
(``taskd.worker.torch_group.outlive_exit``). And a worker frees each work it finished itself, which for a work
made during backward takes the GIL (torch stashes a context in the thread-local state the work captures): a
script that ends right after its last backward may be finalizing by then, so a LiveGroup's process also waits
until no other thread is runnable before the interpreter finalizes (``settle_threads``, ``settle_at_exit``).

Each run is one 2-rank torchrun job of a few DDP steps; the endings alternate, so the machine's load touches them
alike. "plain" ends as a DDP script usually does (an all-reduce, a barrier, ``destroy_process_group``); "kept"
also keeps the groups; "last step, kept" ends right after the last step's optimizer step, keeping the groups
(``live.close()`` before 2f79527); "last step, settled" also waits for the threads (what a LiveGroup's exit does
now). A reliability count, not a timing.

    python bench/ddp_exit_abort.py [--quick] [--runs 36]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from common import bench_env, header, table, write_result

ENDINGS = ("plain", "kept", "last step, kept", "last step, settled")


def rank_main(ending: str) -> int:
    """One rank of the job, ending as ``ending`` names (the module's docstring)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from taskd.worker.torch_group import outlive_exit, settle_threads

    dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp = DistributedDataParallel(model)
    at_last_step = ending.startswith("last step")
    for step in range(5):
        optimizer.zero_grad()
        ddp(torch.randn(8, 64)).sum().backward()
        optimizer.step()
        if not (at_last_step and step == 4):
            dist.all_reduce(torch.ones(1))
    if not at_last_step:
        dist.barrier()
    groups = list(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()
    if ending != "plain":
        outlive_exit(groups)
    if ending == "last step, settled":
        settle_threads()
    return 0


def one_job(ending: str) -> tuple[bool, bool]:
    """(failed, aborted): whether torchrun failed the job, and whether a rank was aborted the way named above."""
    env = bench_env()
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="taskd-exit-abort-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             os.path.abspath(__file__), "--rank-of", ending],
            capture_output=True, text=True, timeout=180, env=env, cwd=tmp)
    return proc.returncode != 0, "terminate called without an active exception" in proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=36, help="jobs per ending (default 36)")
    parser.add_argument("--quick", action="store_true", help="one job per ending")
    parser.add_argument("--rank-of", choices=ENDINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        return rank_main(args.rank_of)
    if args.quick:
        args.runs = 1
    info = header("ddp_exit_abort", args)
    print(f"DDP over gloo, 2 ranks under torchrun, {args.runs} jobs per ending; load average at start "
          f"{info['machine']['loadavg_at_start']}", flush=True)
    counts = {ending: [0, 0] for ending in ENDINGS}
    for _ in range(args.runs):
        for ending in ENDINGS:
            failed, aborted = one_job(ending)
            counts[ending][0] += failed
            counts[ending][1] += aborted
    print(table(["ending", "jobs", "failed", "of them aborted (terminate called ...)"],
                [[ending, args.runs, failed, aborted] for ending, (failed, aborted) in counts.items()]))
    write_result("ddp_exit_abort", {**info, "runs": args.runs,
                                    "endings": {e: {"failed": f, "aborted": a} for e, (f, a) in counts.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
