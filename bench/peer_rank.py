"""examples/torch/train_ddp.py's job written against a peer's own API, for bench/peers.py.

The same model, seed, data and optimizer as the example (its `make_model`, `batch` and argument
parser are imported, so the job cannot drift), the same per-step progress records (`STEP TIME PID`
in PROGRESS/rank<R>.progress), the same outputs (OUT/final.pt, OUT/summary.json with the steps
computed per rank). Only the fault-tolerance API differs, selected by `--api`:

- `nvrx`: plain `torch.nn.parallel.DistributedDataParallel` under NVRx's `ft_launcher`, with its
  `RankMonitorClient` heartbeat sent every step; a restart resumes from the newest checkpoint
  every rank holds (the launcher restarts the whole group);
- `torchft`: one torchft replica group of one rank per rank of the job (started by
  bench/run_torchft.py): the gradients are averaged with `Manager.allreduce`, one tensor per
  parameter, and a step is committed (as `torchft.Optimizer` does) only if every replica's allreduce
  succeeded;
  a restarted replica receives the live state from a peer (torchft's checkpoint transport);
- `torchft-ddp`: the same with torchft's `DistributedDataParallel` wrapper doing the allreduce;
- `snapshots`: taskd's in-memory snapshots in a plain DDP script (no `LiveGroup`), under `taskd run
  --strategies job-rescheduling,exit`: `TorchSnapshots.save` every K steps (`--snapshot-every=K` right after
  `--api`, default 1), and a restarted group resumes from the newest step every rank holds in memory.

Run by bench/peers.py and bench/goodput.py; a taskd program only with `--api=snapshots`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch"))
from train_ddp import batch, make_model, parse_args  # noqa: E402


class Records:
    """The example's per-rank records: progress lines, one byte per completed step, the rank's json."""

    def __init__(self, args, rank: int) -> None:
        os.makedirs(args.out, exist_ok=True)
        os.makedirs(args.progress_dir, exist_ok=True)
        self.args, self.rank = args, rank
        self.counter = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.progress = os.open(os.path.join(args.progress_dir, f"rank{rank}.progress"),
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.started = time.time()

    def step_done(self, step: int) -> None:
        os.write(self.counter, b".")
        os.write(self.progress, f"{step} {time.time():.6f} {os.getpid()}\n".encode())

    def finish(self, restarts: int) -> None:
        os.close(self.counter)
        os.close(self.progress)
        record = {"rank": self.rank, "pid": os.getpid(), "restart_count": restarts, "generation": 0,
                  "seconds": time.time() - self.started}
        path = os.path.join(self.args.out, f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(record, fh)
        os.replace(path + ".tmp", path)


def write_summary(args, model: nn.Module, world: int, wait: float = 0.0) -> None:
    """Rank 0's final.pt and summary.json (the example's format), once every rank's record is there."""
    deadline = time.monotonic() + wait
    paths = [os.path.join(args.out, f"rank{r}.json") for r in range(world)]
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt.tmp"))
    os.replace(os.path.join(args.out, "final.pt.tmp"), os.path.join(args.out, "final.pt"))
    ranks = {}
    for r, p in enumerate(paths):
        with open(p) as fh:
            ranks[r] = json.load(fh)
        ranks[r]["computed"] = os.path.getsize(os.path.join(args.out, f"rank{r}.computed"))
    summary = {"steps": args.steps, "computed": {r: v["computed"] for r, v in ranks.items()},
               "recomputed": {r: v["computed"] - args.steps for r, v in ranks.items()},
               "restart_count": max(v["restart_count"] for v in ranks.values()), "generation": 0, "ranks": ranks}
    with open(os.path.join(args.out, "summary.json.tmp"), "w") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(os.path.join(args.out, "summary.json.tmp"), os.path.join(args.out, "summary.json"))


def run_nvrx(args) -> int:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    monitor = RankMonitorClient()
    monitor.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # the example's bucket layout (one bucket per parameter, as LiveGroup builds it under torchrun): DDP's default
    # buckets are rebuilt after the first step, so a restart's first step would sum in another order than the
    # fault-free run's and differ in the last bits
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb_list=[1.0 / (1 << 20)])
    ckpt_dir = Path(args.ckpt_dir) / f"rank{rank}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    own = max((int(p.stem.split("-")[1]) for p in ckpt_dir.glob("step-*.pt")), default=0)
    common = torch.tensor([own])
    dist.all_reduce(common, op=dist.ReduceOp.MIN)  # the newest checkpoint every rank holds
    start = int(common.item())
    if start:
        state = torch.load(ckpt_dir / f"step-{start}.pt", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    rec = Records(args, rank)
    for step in range(start, args.steps):
        x, y = batch(args, rank, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        rec.step_done(step)
        monitor.send_heartbeat()
        done = step + 1
        if args.ckpt_every and done % args.ckpt_every == 0 and done < args.steps:
            tmp = ckpt_dir / f"step-{done}.pt.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
            os.replace(tmp, ckpt_dir / f"step-{done}.pt")
            for old in sorted(ckpt_dir.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[:-3]:
                old.unlink()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    rec.finish(restarts)
    dist.barrier()
    if rank == 0:
        write_summary(args, model, world)
    monitor.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


def run_torchft(args, wrapper: bool) -> int:
    import torchft

    rank, world = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # a survivor blocked in an allreduce with a replica that already left waits out this timeout (bench/run_torchft.py
    # sets torchft's own example's 5 s); the Manager reads the same variable
    timeout = timedelta(seconds=float(os.environ.get("TORCHFT_TIMEOUT_SEC", args.pg_timeout)))
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timeout),
        min_replica_size=world,  # every step averages every rank's batch, as the DDP job does
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), optimizer.load_state_dict(s["optimizer"])),
        state_dict=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        replica_id=f"peers_{rank}", timeout=timeout, quorum_timeout=timedelta(seconds=args.pg_timeout * 2))
    forward = torchft.DistributedDataParallel(manager, model) if wrapper else model
    rec = Records(args, rank)
    while manager.current_step() < args.steps:
        step = manager.current_step()
        # torchft.Optimizer's zero_grad and step, written out to see whether the step committed: the quorum
        # starts here; a restarted replica is healed (receives the state, its step jumps) inside it, and does
        # not take part in that step (its gradients are zeroed, its batch unused)
        manager.start_quorum()
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(args, rank, step)
        nn.functional.mse_loss(forward(x), y).backward()
        if not wrapper:
            for work in [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]:
                work.wait()
        if manager.should_commit():  # every replica's allreduce of this step succeeded
            optimizer.step()
            rec.step_done(manager.current_step() - 1)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    rec.finish(restarts)
    if rank == 0:
        write_summary(args, model, world, wait=args.pg_timeout)
    manager.shutdown(wait=False)
    return 0


def run_snapshots(args, every: int) -> int:
    """The plain-DDP job with `TorchSnapshots` (examples/torch/train_plain.py's two lines) and a heartbeat a step."""
    from taskd import worker
    from taskd.worker.torch_buckets import stable_ddp
    from taskd.worker.torch_snapshot import TorchSnapshots

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ddp = stable_ddp(model)  # one bucket layout in every wrapper: a restarted group sums as the fault-free one
    snapshots = TorchSnapshots(model, optimizer)
    start = snapshots.restore()  # the newest step every rank holds in memory, 0 if none
    steps = torch.tensor([start])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    if int(steps) != start:
        raise SystemExit(f"rank {rank}: restored step {start}, another rank step {int(steps)}: not one cut")
    rec = Records(args, rank)
    for step in range(start, args.steps):
        x, y = batch(args, rank, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        rec.step_done(step)
        if every and (step + 1) % every == 0:
            snapshots.save(step + 1)
        worker.heartbeat(step + 1)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    snapshots.close()
    rec.finish(worker.restart_count())
    dist.barrier()
    if rank == 0:
        write_summary(args, model, world)
    dist.destroy_process_group()
    return 0


APIS = ("nvrx", "torchft", "torchft-ddp", "snapshots")


def main() -> int:
    argv = sys.argv[1:]
    if not argv[:1] or argv[0].removeprefix("--api=") not in APIS or not argv[0].startswith("--api="):
        sys.exit(f"usage: peer_rank.py --api={{{','.join(APIS)}}} [--snapshot-every=K] TRAIN_DDP_ARGS...")
    api = argv.pop(0).split("=", 1)[1]
    every = 1
    if argv[:1] and argv[0].startswith("--snapshot-every="):
        every = int(argv.pop(0).split("=", 1)[1])
    args = parse_args(argv)
    if api == "snapshots":
        return run_snapshots(args, every)
    if api == "nvrx":
        return run_nvrx(args)
    return run_torchft(args, wrapper=api == "torchft-ddp")


if __name__ == "__main__":
    sys.exit(main())
