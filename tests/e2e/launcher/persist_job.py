"""A rank for the persisted-snapshot tests: an 8 MB state, a snapshot every step, each save() timed.

The update of step s is a pure function of (rank, s), so a run resumed from any step ends bit-identical to one
that never stopped. Writes OUT/rank<R>.json (where it resumed from, the save times) and OUT/rank<R>.npy.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from taskd import worker

SIZE = 1 << 20  # float64s: 8 MB


def update(w: np.ndarray, rank: int, step: int) -> np.ndarray:
    return w * 0.5 + float((rank + 1) * (step + 1))


def wait_persisted(rank: int, step: int, timeout: float = 120.0) -> None:
    path = os.path.join(os.environ["TASKD_SNAPSHOT_PERSIST_DIR"], f"rank{rank}", f"s{step:012d}.snap")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} not persisted within {timeout} s")
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--wait-persisted", default="", help="steps (1,2,...) after whose save the rank waits until "
                   "the agent persisted them: the test's copies, however loaded the machine")
    args = p.parse_args()
    waits = {int(s) for s in args.wait_persisted.split(",") if s}
    rank = worker.rank()
    os.makedirs(args.out, exist_ok=True)
    snapshots = worker.Snapshots()
    found = snapshots.restore()
    state = found[0] if found else {"w": np.zeros(SIZE), "step": 0}
    resumed_from, saves = state["step"], []
    for step in range(resumed_from, args.steps):
        state = {"w": update(state["w"], rank, step), "step": step + 1}
        started = time.perf_counter()
        snapshots.save(state, step + 1)
        saves.append(time.perf_counter() - started)
        if step + 1 in waits:
            wait_persisted(rank, step + 1)
        time.sleep(args.step_sleep)
    snapshots.close()
    np.save(os.path.join(args.out, f"rank{rank}.npy"), state["w"])
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump({"resumed_from": resumed_from, "restored_from": snapshots.restored_from, "saves": saves}, fh)


if __name__ == "__main__":
    main()
