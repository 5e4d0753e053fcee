"""A stand-in for a training script, for plugin tests that do not need real MindSpore training.

As msrun's scheduler (``MS_ROLE=MS_SCHED``) it returns at once, or with ``--scheduler-holds-port``
listens on ``MS_SCHED_PORT`` for a while like a real scheduler would (to test that it gets reaped).
As a worker it records its start in ``<state-dir>/start-rank<R>-<pid>``, prints progress, sleeps in
small steps for ``--duration`` seconds, can crash (always, or once per marker file), and records a
clean end in ``<state-dir>/done-rank<R>-<pid>``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", required=True)
    p.add_argument("--duration", type=float, default=3.0, help="seconds a worker runs before exiting 0")
    p.add_argument("--tick", type=float, default=0.1, help="seconds per progress step")
    p.add_argument("--crash", choices=("never", "always", "once"), default="never")
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--crash-after", type=float, default=0.5, help="seconds before the crash")
    p.add_argument("--crash-code", type=int, default=3)
    p.add_argument("--scheduler-holds-port", type=float, default=0.0,
                   help="as the scheduler, listen on MS_SCHED_PORT for up to this many seconds")
    return p.parse_args(argv)


def touch(path: str, text: str = "") -> None:
    with open(path, "w") as f:
        f.write(text)


def run_scheduler(args: argparse.Namespace) -> int:
    if args.scheduler_holds_port <= 0:
        return 0
    port = int(os.environ.get("MS_SCHED_PORT", "0"))
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        touch(os.path.join(args.state_dir, f"scheduler-{os.getpid()}"), str(port))
        time.sleep(args.scheduler_holds_port)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.state_dir, exist_ok=True)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return run_scheduler(args)
    rank = int(os.environ.get("RANK_ID", "-1"))
    pid = os.getpid()
    touch(os.path.join(args.state_dir, f"start-rank{rank}-{pid}"), str(time.time()))
    print(f"dummy rank {rank} pid {pid} started", flush=True)

    crashes = rank == args.crash_rank and args.crash != "never"
    marker = os.path.join(args.state_dir, f"crashed-rank{rank}")
    if args.crash == "once" and os.path.exists(marker):
        crashes = False
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < args.duration:
        if crashes and time.monotonic() - started >= args.crash_after:
            touch(marker, str(pid))
            print(f"dummy rank {rank} crashing with code {args.crash_code}", flush=True)
            return args.crash_code
        step += 1
        print(f"dummy rank {rank} step {step}", flush=True)
        time.sleep(args.tick)
    touch(os.path.join(args.state_dir, f"done-rank{rank}-{pid}"), str(step))
    print(f"dummy rank {rank} done after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
