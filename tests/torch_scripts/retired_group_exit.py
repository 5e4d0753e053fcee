"""Rank 0 of 2 leaves a gloo group while its own allreduce still waits on rank 1, then exits.

``--hold``: the group is held as LiveGroup holds a group it left (taskd.worker.torch_group.RetiredGroups).
Without it, freeing the group at interpreter exit waits out the allreduce's timeout.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from taskd.worker.torch_group import RetiredGroups


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    store = dist.FileStore(args.store, 2)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=2,
                            timeout=timedelta(seconds=args.timeout))
    if args.rank == 1:
        print("rank 1: in the group", flush=True)
        time.sleep(3600)  # never joins rank 0's allreduce; the test kills it
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    retired = RetiredGroups()
    if args.hold:
        retired.hold(dist.distributed_c10d._get_default_group(), args.timeout)
    dist.destroy_process_group()
    print(f"rank 0: left the group (its allreduce completed: {work.is_completed()}); kept past exit: "
          f"{retired.keep_past_exit()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
