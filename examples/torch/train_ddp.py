"""DDP over gloo that survives losing a rank without stopping the others (taskd live recovery).

An MLP (about 9 M parameters by default) learns a fixed random teacher. The batch of step s is a
pure function of (seed, rank, s), so every run computes exactly the same updates: the final
parameters of a run with faults are bit-identical to those of a run without.

    torchrun --standalone --nproc-per-node 2 examples/torch/train_ddp.py --steps 100 --ckpt-every 20 \\
        --ckpt-dir /tmp/ddp/ckpt --out /tmp/ddp/out
    taskd run --nproc-per-node 4 examples/torch/train_ddp.py --steps 300 --ckpt-every 20 \\
        --ckpt-dir /tmp/ddp/ckpt --out /tmp/ddp/out --crash-at-step 50

Under torchrun it is an ordinary DDP script that resumes from its newest common checkpoint after
a restart. Under taskd with live recovery a lost rank is replaced in place: the survivors keep
their processes and memory, the replacement receives the state over the rebuilt group.

Rank 0 writes OUT/final.pt (the model's state_dict) and OUT/summary.json (steps computed per rank
including recomputed ones, restarts and generations seen, recoveries with their timings).

It accepts a changing world size (``LiveGroup(on_resize=...)``): started with ``taskd run --nnodes MIN:MAX``, a
lost node that is not replaced in time lets the job go on with the others (scale-in), and a node that joins
later grows it back. ``on_resize`` re-shards: the batch of step s is drawn for the rank's new place in the
group, and each rank's share grows so that the global batch stays about ``--batch`` x the full world size.
Per-rank files (OUT/rank<R>.*, checkpoints) keep the rank the process was started as.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

try:
    from taskd import worker
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from taskd import worker
from taskd.worker.live import RetryableError
from taskd.worker.torch import LiveGroup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True, help="total number of optimizer steps")
    p.add_argument("--ckpt-every", type=int, required=True, help="per-rank checkpoint every K steps (0: never)")
    p.add_argument("--ckpt-dir", required=True, help="checkpoint directory (one subdirectory per rank)")
    p.add_argument("--ckpt-async", action="store_true",
                   help="save the periodic checkpoints in the background (CheckpointManager.save_async): the state is "
                        "serialized in memory and training goes on while the file is written")
    p.add_argument("--out", required=True, help="directory for final.pt, summary.json and per-rank records")
    p.add_argument("--snapshot-every", type=int, default=0,
                   help="snapshot the state in memory every K steps (LiveGroup(snapshot_every=K)): a restart of every "
                        "rank (node 0 lost, job-rescheduling) restores from memory, not from --ckpt-dir (0: off)")
    p.add_argument("--snapshot-keep", type=int, default=4,
                   help="snapshots kept per rank: more than the steps a buddy node's copy lags (taskd status)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--sleep-while", default=None, metavar="FILE",
                   help="sleep --step-sleep per step only while FILE exists (a test paces the job while it acts on it)")
    p.add_argument("--start-when", default=None, metavar="FILE",
                   help="wait (up to 300 s) for FILE to exist before the first step (a test starts the steps once "
                        "something else is ready, e.g. a warm spare)")
    p.add_argument("--slow", default=None, metavar="RANK:SECONDS",
                   help="rank RANK sleeps SECONDS more in every step, before its forward pass (outside collectives): "
                        "a straggler, for --straggler-factor")
    p.add_argument("--slow-process", action="store_true",
                   help="--slow only in a process started with the job, not in one that joined it later (a successor "
                        "or replacement: TASKD_JOIN_AFTER set): a slow device or host, which a move leaves behind")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--hidden", type=int, default=2048, help="width of the hidden layers (2048: ~9 M parameters)")
    p.add_argument("--layers", type=int, default=3, help="number of hidden layers")
    p.add_argument("--inputs", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--pg-timeout", type=float, default=60.0, help="collective timeout in seconds")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: the GPU LOCAL_RANK modulo the GPUs seen)")
    p.add_argument("--backend", default="gloo",
                   help="the process group's backend (live recovery needs gloo; nccl: every rank restarts)")
    p.add_argument("--progress-dir", default=None,
                   help="append 'STEP TIME PID' to DIR/rank<R>.progress at every completed step (for benchmarks)")
    # fault injection, each once per job (a marker file in --out remembers it), on --fault-rank
    p.add_argument("--fault-rank", type=int, default=1, help="the rank that injects the faults below")
    p.add_argument("--crash-at-step", type=int, default=None, help="SIGKILL itself in the middle of this step")
    p.add_argument("--crash", action="append", default=[], metavar="RANK:STEP",
                   help="rank RANK SIGKILLs itself in the middle of step STEP (repeatable; once each)")
    p.add_argument("--hang-at-step", type=int, default=None, help="hang (sleep) in the middle of this step")
    p.add_argument("--retryable-error-at-step", type=int, default=None,
                   help="raise taskd.worker.RetryableError in the middle of this step")
    p.add_argument("--retryable-after-backward", action="store_true",
                   help="raise it after the step's backward (its gradients reduced) instead of before")
    args = p.parse_args(argv)
    if args.steps < 0 or args.ckpt_every < 0:
        p.error("--steps and --ckpt-every must be >= 0")
    try:
        args.crashes = {tuple(int(v) for v in spec.split(":")) for spec in args.crash}
    except ValueError:
        p.error(f"--crash takes RANK:STEP, got {args.crash}")
    if any(len(c) != 2 for c in args.crashes):
        p.error(f"--crash takes RANK:STEP, got {args.crash}")
    try:
        args.slow_rank, args.slow_seconds = (int(args.slow.split(":")[0]), float(args.slow.split(":")[1])) \
            if args.slow else (None, 0.0)
    except (ValueError, IndexError):
        p.error(f"--slow takes RANK:SECONDS, got {args.slow}")
    if args.slow_process and os.environ.get("TASKD_JOIN_AFTER"):
        args.slow_rank = None  # this process joined a running job: it is not on the slow device
    return args


def make_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(args.seed)  # every rank builds the same initial weights
    layers: list[nn.Module] = []
    width = args.inputs
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.Tanh()]
        width = args.hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def batch(args: argparse.Namespace, rank: int, step: int, size: int | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one step: a function of (seed, rank, step) only (and of the batch size after a resize)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(size or args.batch, args.inputs, generator=g)
    teacher = torch.Generator().manual_seed(args.seed)
    w = torch.randn(args.inputs, 10, generator=teacher) / args.inputs**0.5
    return x, x @ w


def once(args: argparse.Namespace, kind: str, at: int | None, rank: int, step: int, anyrank: bool = False) -> bool:
    """Whether fault ``kind`` fires now; the marker file makes it fire once per job."""
    if at is None or (rank != args.fault_rank and not anyrank) or step != at:
        return False
    marker = os.path.join(args.out, f"fault_{kind}.done")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    print(f"rank {rank}: injecting {kind} at step {step}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    script_started = time.time()  # in a warm spare that runs the script: before it was a rank, maybe long before
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    def on_resize(new_rank: int, world: int) -> None:
        shard.update(rank=new_rank, batch=max(1, round(args.batch * full_world / world)))
        print(f"rank {rank}: resized to rank {new_rank} of {world}, {shard['batch']} samples a step", flush=True)

    # Built before LiveGroup() and the same on every rank: a replacement builds them while the survivors re-form the
    # group, and a warm spare that runs the script (taskd run --warm-spare-mode script) before it is a rank at all.
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = make_model(args).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    live = LiveGroup(backend=args.backend, timeout=args.pg_timeout, on_resize=on_resize,
                     snapshot_every=args.snapshot_every, snapshot_keep=args.snapshot_keep)
    rank = worker.rank()  # the rank this process was started as: its files and checkpoints keep it
    full_world = worker.world_size()  # the job's size at start: the global batch is args.batch x this
    shard = {"rank": rank, "batch": args.batch}  # what this rank draws; on_resize re-shards
    ddp = live.ddp(model)
    live.track(model=model, optimizer=optimizer, seed=args.seed)

    ckpt = worker.CheckpointManager(os.path.join(args.ckpt_dir, f"rank{rank}"), keep=3, serializer="torch")

    def load(step: int) -> None:
        if step > 0:
            state = ckpt.load(step)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

    def save(step: int, background: bool = False) -> None:
        with worker.section("checkpoint", timeout=120):  # a background save: its serialization, and a wait for the last
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            if background:
                ckpt.save_async(state, step, timeout=100)  # within the section's 120 s, with a message of its own
            else:
                ckpt.save(state, step)

    worker.on_save_request(lambda: save(live.step_no))  # the agent asks before a planned stop: on disk when it returns
    # one byte per completed step, appended by every incarnation of this rank: counts recomputed steps
    counter = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    progress = None
    if args.progress_dir:
        os.makedirs(args.progress_dir, exist_ok=True)
        progress = os.open(os.path.join(args.progress_dir, f"rank{rank}.progress"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if args.start_when:
        deadline = time.monotonic() + 300
        while not os.path.exists(args.start_when):
            if time.monotonic() > deadline:
                raise SystemExit(f"rank {rank}: {args.start_when} did not appear within 300 s")
            time.sleep(0.05)
    started = time.time()
    first = None
    for step in live.steps(ckpt.latest_step() or 0, args.steps, load=load):
        first = step if first is None else first
        with live.step():
            if rank == args.slow_rank:
                time.sleep(args.slow_seconds)
            x, y = (t.to(device) for t in batch(args, shard["rank"], step, shard["batch"]))
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(ddp(x), y)
            if once(args, "crash", args.crash_at_step, rank, step) or \
                    ((rank, step) in args.crashes and once(args, f"crash{rank}", step, rank, step, anyrank=True)):
                os.kill(os.getpid(), signal.SIGKILL)
            if once(args, "hang", args.hang_at_step, rank, step):
                time.sleep(3600)
            if not args.retryable_after_backward and once(args, "retryable", args.retryable_error_at_step, rank, step):
                raise RetryableError(f"injected at step {step}")
            loss.backward()
            if args.retryable_after_backward and once(args, "retryable", args.retryable_error_at_step, rank, step):
                raise RetryableError(f"injected at step {step}, after backward")
            optimizer.step()
            os.write(counter, b".")
            if progress is not None:
                os.write(progress, f"{step} {time.time():.6f} {os.getpid()}\n".encode())
        if args.ckpt_every and live.step_no % args.ckpt_every == 0 and live.step_no > step:
            save(live.step_no, background=args.ckpt_async)
            print(f"rank {rank}: step {live.step_no}/{args.steps} loss {loss.item():.6f}", flush=True)
        if args.step_sleep and (args.sleep_while is None or os.path.exists(args.sleep_while)):
            time.sleep(args.step_sleep)
    os.close(counter)
    if progress is not None:
        os.close(progress)
    if not ckpt.wait(timeout=120):
        print(f"rank {rank}: the last background checkpoint is still being written after 120 s", flush=True)

    record = {"rank": rank, "pid": os.getpid(), "script_started": script_started, "first_step": first,
              "restart_count": worker.restart_count(), "generation": live.protocol.generation,
              "recoveries": live.events, "seconds": time.time() - started,
              "restored_from": live.memory.restored_from,
              "group_rank": live.rank, "world_size": live.world_size}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    dist.barrier()
    if live.rank == 0:
        write_summary(args, model)
    live.close()
    print(f"rank {rank}: done at step {args.steps}", flush=True)
    return 0


def write_summary(args: argparse.Namespace, model: nn.Module) -> None:
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(args.out, "final.pt.tmp"))
    os.replace(os.path.join(args.out, "final.pt.tmp"), os.path.join(args.out, "final.pt"))
    ranks = {}
    started_as = sorted(int(name[4:-5]) for name in os.listdir(args.out)  # every rank that finished (rank<R>.json)
                        if name.startswith("rank") and name.endswith(".json"))
    for r in started_as:
        with open(os.path.join(args.out, f"rank{r}.json")) as fh:
            ranks[r] = json.load(fh)
        ranks[r]["computed"] = os.path.getsize(os.path.join(args.out, f"rank{r}.computed"))
    summary = {
        "steps": args.steps,
        "computed": {r: info["computed"] for r, info in ranks.items()},
        "recomputed": {r: info["computed"] - args.steps for r, info in ranks.items()},
        "restart_count": max(info["restart_count"] for info in ranks.values()),
        "generation": max(info["generation"] for info in ranks.values()),
        "ranks": ranks,
    }
    with open(os.path.join(args.out, "summary.json.tmp"), "w") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(os.path.join(args.out, "summary.json.tmp"), os.path.join(args.out, "summary.json"))


if __name__ == "__main__":
    sys.exit(main())
