"""One rank of a 2-rank DDP job over gloo that counts, step by step, whether a gloo worker still holds the step's
autograd context right after backward, and whether it still does after `settle_threads`.

torch 2.13 stashes a context in the thread-local state during backward (``torch._C._stash_obj_in_tls``), every
gloo work made then captures it, and the worker that finished the work frees it, which takes the GIL: until then
the context has one more reference. Were the interpreter finalizing when the worker asks for the GIL, the rank
would abort (taskd.worker.torch_group.settle_threads). Run without a launcher (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE set by the test); prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from taskd.worker.torch_group import settle_threads

STEPS = 50


def main() -> int:
    stash = getattr(torch._C, "_stash_obj_in_tls", None)
    if stash is None:
        print(json.dumps({"stash": False}), flush=True)
        return 0
    stashed: list[object] = []

    def keep(key: str, obj: object) -> None:
        stashed.append(obj)
        stash(key, obj)

    torch._C._stash_obj_in_tls = keep
    dist.init_process_group("gloo")
    ddp = DistributedDataParallel(torch.nn.Linear(64, 64))
    held = settled_held = 0
    for _ in range(STEPS):
        ddp(torch.randn(8, 64)).sum().backward()
        context = stashed.pop()
        stashed.clear()
        held += sys.getrefcount(context) > 2  # ours and getrefcount's own: anything more is a work's
        settle_threads()
        settled_held += sys.getrefcount(context) > 2
        del context
    print(json.dumps({"stash": True, "steps": STEPS, "held": held, "settled_held": settled_held}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    settle_threads()
    return 0


if __name__ == "__main__":
    sys.exit(main())
