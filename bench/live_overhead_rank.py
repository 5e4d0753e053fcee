"""One rank of bench/live_overhead.py: the same MLP and data as examples/torch/train_ddp.py, in one of
three wirings, timing every step; rank 0 writes OUT/rank0.json with the step times and the job's CPU seconds
(every process of it, ranks and launcher: bench/common.job_cpu_seconds under $BENCH_PID) after step WARMUP and
after the last step.

    plain         dist.init_process_group + DistributedDataParallel(model), DDP's default buckets
    live          LiveGroup + live.ddp (DDP's buckets, fixed at construction) + track(model, optimizer): the vote
    live-novote   the same, the optimizer handed over as an extra object: no optimizer hooks, no vote
    paired        live's wiring, then blocks of BLOCK steps in alternating order inside the same processes (on, off;
                  off, on; ...): "on" steps run as in live (`live.steps()`, `live.step()`, the DDP handle: the vote,
                  the backward's collective mark, the heartbeat, the reseed, the control file's stat), "off" steps
                  the same training step through the handle's DDP wrapper itself, outside `live.step()` (the vote's
                  hook returns at once outside a step), one `live.steps()` boundary per block. Every rank writes
                  OUT/rank<r>.json: each block's CPU (`time.process_time`: every thread of the rank) and wall time,
                  its Python threads' CPU (schedstat; taskd's leave watch: it runs in both kinds of block), and
                  rank 0's record the CPU of the job's other processes (the launcher) over each block

argv: MODE OUT STEPS HIDDEN LAYERS [WARMUP [BLOCK]]  (paired: STEPS is the number of pairs)
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import job_cpu_seconds, job_processes  # noqa: E402 (bench/: this script's own directory)

from taskd.worker.torch import LiveGroup  # noqa: E402

INPUTS, BATCH, SEED = 256, 32, 1234
RANK_SCRIPT = os.path.basename(__file__)
TEARDOWN_TIMEOUT = 60.0
"""Seconds the plain rank's teardown (destroy_process_group) may take before faulthandler prints every thread's
stack to stderr (the bench shows it in the run's error) and exits 1: a hang becomes a failure that says where."""


def build(hidden: int, layers: int) -> nn.Module:
    torch.manual_seed(SEED)
    blocks: list[nn.Module] = [nn.Linear(INPUTS, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED * 1_000_003 + rank * 10_007 + step)
    return torch.randn(BATCH, INPUTS, generator=g), torch.randn(BATCH, 1, generator=g)


def train_step(ddp: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each Python thread of this process but the main one (schedstat: nanoseconds), by native id."""
    out = {}
    for t in threading.enumerate():
        if t is threading.main_thread() or t.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as fh:
                out[t.native_id] = int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def launcher_cpu(procs: list[Any]) -> float:
    """CPU seconds so far of the job's processes that are not ranks (its launcher), read from /proc by psutil."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
    return total


def is_rank(proc: Any) -> bool:
    """Whether `proc` is one of this job's ranks: a sibling of this one (the launcher's child) running this script."""
    try:
        return proc.ppid() == os.getppid() and any(a.endswith(RANK_SCRIPT) for a in proc.cmdline()[:4])
    except Exception:  # noqa: BLE001 - gone: no rank of the steady state
        return False


def paired(out: str, pairs: int, hidden: int, layers: int, warmup: int, block: int) -> NoReturn:
    """Blocks with and without LiveGroup's per-step work in the same processes (the module docstring)."""
    bench = int(os.environ.get("BENCH_PID", "0"))
    model = build(hidden, layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    live = LiveGroup(backend="gloo")
    handle = live.ddp(model)
    live.track(model=model, optimizer=optimizer, seed=SEED)
    rank = live.rank
    schedule = [k for i in range(pairs) for k in (("on", "off") if i % 2 == 0 else ("off", "on"))]
    steps = live.steps(0, warmup + block * len(schedule))
    for _ in range(warmup):
        next(steps)
        with live.step() as step:
            train_step(handle, optimizer, rank, step)
    # not the ranks (this process's siblings): the launcher above them and whatever else the job runs
    procs = [p for p in job_processes(bench) if not is_rank(p)] if bench and rank == 0 else []
    threads0 = thread_cpu()
    blocks = []
    cpu, main, wall, other = time.process_time(), time.thread_time(), time.perf_counter(), launcher_cpu(procs)
    threads = sum(threads0.values())
    for kind in schedule:
        if kind == "on":
            for _ in range(block):
                next(steps)  # the control file's stat
                with live.step() as step:
                    train_step(handle, optimizer, rank, step)
        else:
            first = next(steps)  # one boundary for the block
            for j in range(block):
                train_step(handle.current, optimizer, rank, first + j)
            live.step_no = first + block
        now, m, t, o = time.process_time(), time.thread_time(), time.perf_counter(), launcher_cpu(procs)
        th = sum(thread_cpu().values())
        blocks.append({"kind": kind, "cpu": now - cpu, "main": m - main, "wall": t - wall, "launcher": o - other,
                       "threads": th - threads})
        cpu, main, wall, other, threads = now, m, t, o, th
    threads1 = thread_cpu()
    next(steps, None)  # the loop's end: COMPLETE
    live.close()
    record = {"mode": "paired", "rank": rank, "blocks": blocks, "block": block,
        "params": sum(p.numel() for p in model.parameters()),
        "threads_cpu": sum(threads1.get(k, 0.0) - v for k, v in threads0.items()),
        "threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
        "launcher_processes": [p.name() for p in procs]}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    # no interpreter teardown, as the plain mode: torch 2.13's gloo teardown can hang or abort a rank after its results
    # are written (LiveGroup.close says so); a torchrun quick job failed once at this point (its cause was not kept)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> int:
    if sys.argv[1] == "paired":
        return paired(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
                      int(sys.argv[7]))
    mode, out, steps, hidden, layers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    warmup = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    bench = int(os.environ.get("BENCH_PID", "0"))
    model = build(hidden, layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times: list[float] = []
    cpu: list[float | None] = []

    def stepped(rank: int) -> None:
        """After every step: its time; rank 0 reads the job's CPU after step `warmup` and after the last."""
        times.append(time.perf_counter())
        if bench and rank == 0 and len(times) in (warmup + 1, steps):
            cpu.append(job_cpu_seconds(bench))

    if mode == "plain":
        dist.init_process_group("gloo")
        ddp = DistributedDataParallel(model)
        rank = dist.get_rank()
        for step in range(steps):
            train_step(ddp, optimizer, rank, step)
            stepped(rank)
        faulthandler.dump_traceback_later(TEARDOWN_TIMEOUT, exit=True)
        dist.destroy_process_group()
    else:
        live = LiveGroup(backend="gloo")
        ddp = live.ddp(model)
        if mode == "live":
            live.track(model=model, optimizer=optimizer, seed=SEED)
        else:
            live.track(model=model, seed=SEED, optimizer_state=optimizer)
        rank = live.rank
        for step in live.steps(0, steps):
            with live.step():
                train_step(ddp, optimizer, rank, step)
            stepped(rank)
        live.close()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        with open(os.path.join(out, "rank0.json"), "w") as fh:
            json.dump({"mode": mode, "times": times, "params": params, "cpu": cpu}, fh)
    if mode == "plain":
        # no interpreter teardown: a plain rank once sat in a futex wait after its results were written, gloo's two
        # worker threads still alive (the DDP reducer still held the process group), until the bench's timeout
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
