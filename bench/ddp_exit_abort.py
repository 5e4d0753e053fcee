"""How often a finished DDP job over gloo fails at its end under plain torchrun, with and without keeping its groups.

torch 2.13's DistributedDataParallel keeps its gloo group alive past ``destroy_process_group``, so the group is
freed while the interpreter finalizes, and a gloo worker that then needs the GIL aborts the rank (``SIGABRT``,
"terminate called without an active exception"). ``live.close()`` therefore keeps every group
(``taskd.worker.torch_group.outlive_exit``). Each run here is one 2-rank torchrun job (a few DDP steps, an
all-reduce, a barrier, ``destroy_process_group``), ending either as plain DDP does or keeping its groups; the two
endings alternate, so the machine's load touches both alike. A reliability count, not a timing.

    python bench/ddp_exit_abort.py [--quick] [--runs 36]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from common import bench_env, header, table, write_result

ENDINGS = ("plain", "kept")


def rank_main(ending: str) -> int:
    """One rank of the job: the DDP script's end, either plain or keeping the groups as live.close() does."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from taskd.worker.torch_group import outlive_exit

    dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp = DistributedDataParallel(model)
    for _ in range(5):
        optimizer.zero_grad()
        ddp(torch.randn(8, 64)).sum().backward()
        optimizer.step()
        dist.all_reduce(torch.ones(1))
    dist.barrier()
    groups = list(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()
    if ending == "kept":
        outlive_exit(groups)
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
