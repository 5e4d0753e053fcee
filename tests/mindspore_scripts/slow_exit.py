"""A stand-in training script whose interpreter exit is slow, like MindSpore's finalisation.

Every worker registers an atexit handler that sleeps ``--exit-sleep`` seconds (before its first heartbeat,
as a framework imported by the script would), calls ``taskd.worker.heartbeat(step)`` for ``--steps`` steps,
optionally ``taskd.worker.finished()`` (``--finished``), records ``<state-dir>/done-rank<R>-<pid>`` and
returns 0; the sleep then runs without heartbeats. Each start is recorded in
``<state-dir>/start-rank<R>-<pid>``, the end of the exit sleep in ``<state-dir>/exited-rank<R>-<pid>``.
As msrun's scheduler (``MS_ROLE=MS_SCHED``) it returns at once.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time

from taskd import worker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tick", type=float, default=0.1, help="seconds per step")
    p.add_argument("--exit-sleep", type=float, default=4.0, help="seconds the atexit handler sleeps")
    p.add_argument("--finished", action="store_true", help="call taskd.worker.finished() after the last step")
    return p.parse_args(argv)


def touch(path: str, text: str = "") -> None:
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.state_dir, exist_ok=True)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return 0
    rank, pid = worker.rank(), os.getpid()
    touch(os.path.join(args.state_dir, f"start-rank{rank}-{pid}"), str(time.time()))

    def slow_finalize() -> None:
        print(f"dummy rank {rank} finalizing for {args.exit_sleep}s", flush=True)
        time.sleep(args.exit_sleep)
        touch(os.path.join(args.state_dir, f"exited-rank{rank}-{pid}"), str(time.time()))

    atexit.register(slow_finalize)
    for step in range(1, args.steps + 1):
        worker.heartbeat(step)
        time.sleep(args.tick)
    if args.finished:
        worker.finished()
    touch(os.path.join(args.state_dir, f"done-rank{rank}-{pid}"), str(time.time()))
    print(f"dummy rank {rank} done after {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
