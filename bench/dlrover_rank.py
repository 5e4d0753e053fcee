"""examples/torch/train_ddp.py's job under DLRover 0.6.1's `dlrover-run`, with its Flash Checkpoint in memory.

bench/goodput.py's DLRover system runs this under the python of a venv of its own (DLRover 0.6.1 needs torch 2.7),
so it imports no taskd: train_ddp.py imports taskd at the top for its `LiveGroup`, and this job takes only its
model, data and arguments from it (and bench/peer_rank.py's progress records and summary), so stand-ins for those
taskd modules are put in `sys.modules` first and no taskd code runs (`taskd_stubbed()` tells a test so).

The job is plain DDP over gloo with `find_unused_parameters=True`, under which DDP never re-buckets (taskd's own
fallback for torch < 2.13, taskd.worker.torch_facts; torch 2.7 has no `bucket_cap_mb_list`): DDP's default
re-bucketing after its first step would make the first step after a restart sum in another order than the
fault-free run's, and the final parameters differ in the last bits.

Every --flash-every steps (`--flash-every=K` right after the script, default 1) it saves `{"model", "optimizer",
"step"}` with `DdpCheckpointer.save_checkpoint(..., StorageType.MEMORY)`: local rank 0 copies the state into the
shared memory that `dlrover-run`'s agent holds, so it outlives the ranks; after a fault the agent restarts every
rank and each restores with `load_checkpoint()` (the shared memory, else the newest file on disk, else nothing:
step 0). The restored tensors are views of that shared memory (torch.frombuffer) and `Optimizer.load_state_dict`
keeps a tensor of the right dtype as it is, so they are copied first: otherwise the momentum would live in the
checkpoint's memory and a fault in the middle of an optimizer step would leave a torn checkpoint behind.

    dlrover-run --standalone --nproc-per-node 4 bench/dlrover_rank.py --flash-every=1 TRAIN_DDP_ARGS...
"""

from __future__ import annotations

import os
import sys
import time
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

STUBS = ("taskd", "taskd.worker", "taskd.worker.live", "taskd.worker.torch")


def _stub_taskd() -> None:
    """Stand-ins for the taskd modules train_ddp.py imports at its top (this job uses none of them)."""
    for name in STUBS:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["taskd"].worker = sys.modules["taskd.worker"]  # type: ignore[attr-defined]
    sys.modules["taskd.worker.live"].RetryableError = RuntimeError  # type: ignore[attr-defined]
    sys.modules["taskd.worker.torch"].LiveGroup = None  # type: ignore[attr-defined]


def taskd_stubbed() -> bool:
    """Whether every taskd module loaded is one of this script's stand-ins (no file behind it)."""
    return all(getattr(m, "__file__", None) is None for n, m in sys.modules.items() if n.split(".")[0] == "taskd")


_stub_taskd()
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peer_rank import Records, write_summary  # noqa: E402
from torch import nn  # noqa: E402
from train_ddp import batch, make_model, parse_args  # noqa: E402


def copied(value: Any) -> Any:
    """`value` with every tensor cloned out of DLRover's shared memory."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: copied(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(copied(v) for v in value)
    return value


def run(args: Any, every: int) -> int:
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    ckpt = DdpCheckpointer(args.ckpt_dir)
    state = ckpt.load_checkpoint()
    start = 0
    if state:
        state = copied(state)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    print(f"rank {rank}: restart {restarts}, from step {start}", flush=True)
    rec = Records(args, rank)
    for step in range(start, args.steps):
        x, y = batch(args, rank, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        rec.step_done(step)
        done = step + 1
        if every and done % every == 0 and done < args.steps:
            ckpt.save_checkpoint(done, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "step": done}, storage_type=StorageType.MEMORY)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    rec.finish(restarts)
    dist.barrier()
    if rank == 0:
        write_summary(args, model, world)
    dist.destroy_process_group()
    return 0


def main() -> int:
    argv = sys.argv[1:]
    every = 1
    if argv[:1] and argv[0].startswith("--flash-every="):
        every = int(argv.pop(0).split("=", 1)[1])
    return run(parse_args(argv), every)


if __name__ == "__main__":
    sys.exit(main())
