"""A stand-in training script whose rank stops making progress once, for hang-detection tests under msrun.

Every worker calls ``taskd.worker.heartbeat(step)`` once per step and records its start in
``<state-dir>/start-rank<R>-<pid>``. In the first incarnation (no ``<state-dir>/hung`` marker at
start) rank ``--hang-rank`` writes the marker at step ``--hang-at-step`` and sleeps in
``hang_forever()`` without another heartbeat, while the other ranks keep beating until they are
stopped, so the job cannot end before the hang is detected. A later incarnation sees the marker
and every rank runs ``--steps`` steps, then records ``<state-dir>/done-rank<R>-<pid>`` and exits 0.
As msrun's scheduler (``MS_ROLE=MS_SCHED``) it returns at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from taskd import worker

SAFETY_CAP = 300.0  # seconds: a first incarnation nobody stops still ends on its own


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", required=True)
    p.add_argument("--steps", type=int, default=20, help="steps of an incarnation that runs through")
    p.add_argument("--tick", type=float, default=0.1, help="seconds per step")
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-at-step", type=int, default=5)
    return p.parse_args(argv)


def touch(path: str, text: str = "") -> None:
    with open(path, "w") as f:
        f.write(text)


def hang_forever(rank: int, step: int) -> None:
    """What the test expects to find in the rank's stack dump."""
    print(f"dummy rank {rank} stops making progress at step {step}", flush=True)
    deadline = time.monotonic() + SAFETY_CAP
    while time.monotonic() < deadline:
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.state_dir, exist_ok=True)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return 0
    rank = worker.rank()
    pid = os.getpid()
    touch(os.path.join(args.state_dir, f"start-rank{rank}-{pid}"), str(time.time()))
    marker = os.path.join(args.state_dir, "hung")
    first = not os.path.exists(marker)
    print(f"dummy rank {rank} pid {pid} started ({'first' if first else 'later'} incarnation)", flush=True)

    step = 0
    started = time.monotonic()
    while (first and time.monotonic() - started < SAFETY_CAP) or (not first and step < args.steps):
        step += 1
        worker.heartbeat(step)
        if first and rank == args.hang_rank and step == args.hang_at_step:
            touch(marker, str(pid))
            hang_forever(rank, step)
            return 1
        time.sleep(args.tick)
    if first:
        return 1  # never stopped: the hang went unnoticed
    touch(os.path.join(args.state_dir, f"done-rank{rank}-{pid}"), str(step))
    print(f"dummy rank {rank} done after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
