"""Records the environment a launcher gives a rank; needs no torch (tests compare torchrun's and taskd's).

    env_probe.py OUT [--crash-rank1 N]

Each incarnation writes OUT/start_rank<RANK>_<pid>.json. With --crash-rank1 N, rank 1 exits 3 in
its first N incarnations (counted by OUT/crash_* markers) and every rank waits (at most 60 s) for
rank 1's surviving incarnation before it writes OUT/final_rank<RANK>.json and exits 0; so only the
incarnations that end the job write a final record.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")


def record(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({k: os.environ.get(k) for k in KEYS} | {"pid": os.getpid()}, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--crash-rank1", type=int, default=0)
    args = parser.parse_args()
    rank = os.environ["RANK"]
    os.makedirs(args.out, exist_ok=True)
    record(os.path.join(args.out, f"start_rank{rank}_{os.getpid()}.json"))
    if not args.crash_rank1:
        return
    survivor = os.path.join(args.out, "rank1_survives")
    if rank == "1":
        crashes = len(glob.glob(os.path.join(args.out, "crash_*")))
        if crashes < args.crash_rank1:
            open(os.path.join(args.out, f"crash_{crashes}"), "w").close()
            print(f"rank 1: crash {crashes + 1} of {args.crash_rank1}", flush=True)
            sys.exit(3)
        open(survivor, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(survivor):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: rank 1 never survived")
        time.sleep(0.05)
    record(os.path.join(args.out, f"final_rank{rank}.json"))


if __name__ == "__main__":
    main()
