"""examples/torch/train_hsdp.py's job on torchft 0.2.0's HSDP, as bench/sharded_live.py runs it.

Started by bench/run_torchft.py: each replica group is its own ``torchrun --nproc-per-node S`` (S shards),
its model ``fully_shard``-ed over a 1-D mesh of its S ranks; an all-reduce hook averages each reduce-scattered
gradient shard across replica groups through torchft's Manager (``set_all_reduce_hook``, as torchft's HSDP
does), and a step is committed only where every participant's all-reduce succeeded. ``min_replica_size=1``:
when a rank dies, its torchrun restarts its whole replica group, the other group goes on alone (the dead
group's batches of those steps are never processed), and the restarted group fetches its shards from the rank
of the same group rank in the healthy group (torchft's checkpoint transport). Same model, seed, batches and
``OUT/rank<R>.computed`` lines (R = group id x S + group rank) as the example.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "torch")]

from train_hsdp import batch, build, parse_args, shard  # noqa: E402

from taskd.worker.torch_hsdp import from_local, to_local  # noqa: E402


def both_ready(out: str, group: int, group_rank: int, groups: int, timeout: float) -> None:
    """At the job's first start only: every replica group's rank 0 waits until every group is up, so that the
    first quorum holds all of them (with ``min_replica_size=1`` the first group up would otherwise train its
    first steps alone, and the batches of the others' would count as never processed, before any fault)."""
    if group_rank == 0:
        Path(out, f"up{group}").touch()
        deadline = time.monotonic() + timeout
        while not all(Path(out, f"up{g}").exists() for g in range(groups)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every replica group was up after {timeout:.0f}s")
            time.sleep(0.01)
    dist.barrier()


def main() -> int:
    import torchft

    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    group = int(os.environ["REPLICA_GROUP_ID"])
    model, teacher = build(args)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))  # this replica group's ranks
    group_rank, shards = dist.get_rank(), dist.get_world_size()
    rank = group * shards + group_rank
    mesh = init_device_mesh("cpu", (shards,), mesh_dim_names=("shard",))
    shard(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timeout = timedelta(seconds=float(os.environ.get("TORCHFT_TIMEOUT_SEC", args.pg_timeout)))

    def state_dict() -> dict:  # this rank's local shards: the same group rank of another group holds the same
        return to_local({"model": dict(model.state_dict()), "optim": optimizer.state_dict()})

    def load_state_dict(state: dict) -> None:
        state = from_local(state, mesh)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.to_local().copy_(state["model"][k].to_local())
        optimizer.load_state_dict(state["optim"])

    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                              load_state_dict=load_state_dict, state_dict=state_dict,
                              replica_id=f"hsdp_{group}", timeout=timeout,
                              quorum_timeout=timedelta(seconds=args.pg_timeout * 2))

    def all_reduce_hook(grad: torch.Tensor) -> None:
        manager.allreduce(grad).wait()  # the mean over the replica groups in this quorum

    for m in model.modules():
        if hasattr(m, "set_all_reduce_hook"):
            m.set_all_reduce_hook(all_reduce_hook)
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        both_ready(args.out, group, group_rank, int(os.environ["NUM_REPLICA_GROUPS"]), args.pg_timeout)
    counter = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while manager.current_step() < args.steps:
        manager.start_quorum()  # a restarted group is healed in it: it receives the state, its step jumps
        step = manager.current_step()
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(args, teacher, rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        if manager.should_commit():  # every participant's all-reduce of this step succeeded
            optimizer.step()
            os.write(counter, f"{manager.current_step() - 1} {time.time():.6f} {os.getpid()}\n".encode())
        if args.step_sleep:
            time.sleep(args.step_sleep)
    os.close(counter)
    torch.save({k: v.to_local().clone() for k, v in model.state_dict().items()},
               os.path.join(args.out, f"rank{rank}.pt"))
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
