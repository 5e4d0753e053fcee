"""What a live PyTorch job can hand over, and facts about torch it rests on.

Apart from `taskd.worker.torch`'s group mechanics: these are facts about torch (its DDP arguments,
which modules shard their state), each checked once.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

_DDP_ARGS = inspect.signature(DistributedDataParallel.__init__).parameters
HAS_INIT_SYNC = "init_sync" in _DDP_ARGS
_HAS_BUCKET_LIST = "bucket_cap_mb_list" in _DDP_ARGS


def stable_ddp_kwargs() -> dict[str, Any]:
    """DDP settings under which a rebuilt wrapper reduces gradients exactly as the long-lived one did, where
    the layout cannot be fixed at construction (taskd.worker.torch_buckets, which is preferred).

    DDP re-buckets its gradients after the first iteration (in the order they became ready), and
    gloo's sum over ranks depends on an element's offset in its bucket: a fresh wrapper would
    differ from a fault-free run in the last bits (3.6e-7 measured). One bucket per parameter
    (``bucket_cap_mb_list`` of one byte, torch >= 2.13) makes every layout the same: one
    allreduce per parameter tensor. Older torch gets ``find_unused_parameters=True``, under
    which DDP never re-buckets (one autograd-graph walk per forward, and a warning from DDP).
    """
    if _HAS_BUCKET_LIST:
        return {"bucket_cap_mb_list": [1.0 / (1 << 20)]}
    return {"find_unused_parameters": True}


def step_seed(seed: int, rank_: int, step: int) -> int:
    """A per-(seed, rank, step) seed: a replacement reproduces the dead rank's random stream."""
    return (seed * 1_000_003 + rank_ * 10_007 + step) % (2**63 - 1)


def sharded_state(model: torch.nn.Module) -> str | None:
    """Why `model`'s state cannot be handed over live (FSDP, FSDP2's fully_shard, DTensor shards), or None."""
    for module in model.modules():
        names = {cls.__name__ for cls in type(module).__mro__}
        if names & {"FullyShardedDataParallel", "FSDPModule"}:
            return f"{type(module).__name__} is sharded by FSDP"
    for name, param in model.named_parameters():
        if type(param).__name__ == "DTensor" or "FlatParameter" in {c.__name__ for c in type(param).__mro__}:
            return f"parameter {name!r} is a shard ({type(param).__name__})"
    return None


def backend_not_live(backend: str) -> str | None:
    """Why a group of ``backend`` cannot be rebuilt in place around a lost rank, or None (gloo).

    The live path leaves a broken group by ending its sockets and re-forms it on the store under a new
    generation: gloo's connections are ours to end. An NCCL communicator with a dead peer can only be
    aborted (or killed by torch's watchdog, TORCH_NCCL_ASYNC_ERROR_HANDLING), and MPI/UCC keep their own
    membership: those jobs restart every rank instead (issue 34, item 5)."""
    parts = [part.split(":")[-1].strip().lower() for part in backend.split(",") if part.strip()]
    if parts and all(part == "gloo" for part in parts):
        return None
    return (f"backend {backend!r}: taskd rebuilds a group around a lost rank over gloo only (an NCCL "
            f"communicator with a dead peer can only be aborted)")


def group_device(backend: str) -> torch.device:
    """Where a group's own small tensors (the state sync's table) go: the host, unless every part of the backend
    serves CUDA tensors only (``nccl``), then the device the script chose (``torch.cuda.set_device``)."""
    parts = [part.strip().lower() for part in backend.split(",") if part.strip()]
    if parts and all(part.split(":")[-1] == "nccl" for part in parts) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def collectives_issued() -> int:
    """Collectives run on the default group since it formed (0 where the backend keeps no count)."""
    try:
        return int(torch.distributed.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except (AttributeError, RuntimeError, ValueError):
        return 0
