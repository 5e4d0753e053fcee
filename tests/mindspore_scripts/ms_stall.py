"""Real MindSpore ranks in lockstep (one AllReduce per step) where one rank stalls once, for hang tests.

Each step every rank all-reduces a small tensor, then calls ``taskd.worker.heartbeat(step)``. In the
first incarnation (no ``<state-dir>/stalled-<i>`` marker at start; with a list of ``--stall-how``, each of
the first incarnations in turn) rank ``--stall-rank`` returns from the
AllReduce of step ``--stall-at-step``, beats, and then sleeps in ``stall_forever()`` (or, with
``--stall-how sigstop``, stops its own process as a debugger would); its peers beat that step
``--skew`` seconds later and then wait inside the next AllReduce. Every rank stops beating at the
same step, the stalled one ``--skew`` seconds first, or last with a negative skew (then the waiting
rank's heartbeat is the older one). A CPU AllReduce takes ~0.3 s, so a whole step would be a wide
gap; a small one lets one agent sweep find both ranks past the timeout. A later
incarnation sees the marker and every rank runs ``--steps`` steps without heartbeats, records
``<state-dir>/done-rank<R>-<pid>`` and exits 0. As msrun's scheduler (``MS_ROLE=MS_SCHED``) ``init()``
serves the cluster and the script returns after it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from taskd import worker

SAFETY_CAP = 300.0  # seconds: a stalled rank nobody stops still ends on its own


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-dir", required=True)
    p.add_argument("--steps", type=int, default=30, help="steps of an incarnation that runs through")
    p.add_argument("--tick", type=float, default=0.01, help="seconds to sleep per step")
    p.add_argument("--stall-rank", type=int, default=1)
    p.add_argument("--stall-at-step", type=int, default=20)
    p.add_argument("--skew", type=float, default=0.1,
                   help="how much later the peers beat the stall step (negative: the stalling rank beats later)")
    p.add_argument("--stall-how", default="sleep",
                   help="sleep in stall_forever(), or stop the process with SIGSTOP (as a debugger would); a "
                        "comma-separated list stalls once per incarnation, in order (sigstop,sleep)")
    args = p.parse_args(argv)
    args.stall_hows = args.stall_how.split(",")
    if not set(args.stall_hows) <= {"sleep", "sigstop"}:
        p.error(f"--stall-how takes sleep and sigstop, got {args.stall_how!r}")
    return args


def touch(path: str, text: str = "") -> None:
    with open(path, "w") as f:
        f.write(text)


def stall_forever(rank: int, step: int) -> None:
    """What a stack dump of the stalled rank shows."""
    print(f"rank {rank} stalls after the AllReduce of step {step}", flush=True)
    deadline = time.monotonic() + SAFETY_CAP
    while time.monotonic() < deadline:
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.state_dir, exist_ok=True)
    from mindspore.communication import init

    if os.environ.get("MS_ROLE") == "MS_SCHED":
        init()
        return 0
    import mindspore as ms
    import numpy as np
    from mindspore import ops
    from mindspore.communication import get_rank

    ms.set_device("CPU")
    init()
    rank, pid = get_rank(), os.getpid()
    incarnation = sum(1 for name in os.listdir(args.state_dir) if name.startswith("stalled-"))
    marker = os.path.join(args.state_dir, f"stalled-{incarnation}")
    first = incarnation < len(args.stall_hows)  # this incarnation stalls (the name says "not yet run through")
    how = args.stall_hows[incarnation] if first else None
    touch(os.path.join(args.state_dir, f"start-rank{rank}-{pid}"), str(time.time()))
    print(f"rank {rank} pid {pid} started ({'first' if first else 'later'} incarnation)", flush=True)
    all_reduce = ops.AllReduce()
    value = ms.Tensor(np.ones(4, dtype=np.float32))
    step, started = 0, time.monotonic()
    while (first and time.monotonic() - started < SAFETY_CAP) or (not first and step < args.steps):
        step += 1
        all_reduce(value).asnumpy()
        stall_step = first and step == args.stall_at_step
        if stall_step and (rank != args.stall_rank) == (args.skew > 0):
            time.sleep(abs(args.skew))
        if first:  # a later incarnation is not watched: MindSpore's finalize at exit outlasts a short timeout
            worker.heartbeat(step)
        if stall_step and rank == args.stall_rank:
            touch(marker, str(pid))
            if how == "sigstop":
                print(f"rank {rank} stops itself (SIGSTOP) after the AllReduce of step {step}", flush=True)
                os.kill(pid, signal.SIGSTOP)
            stall_forever(rank, step)
            return 1
        time.sleep(args.tick)
    if first:
        return 1  # nobody stalled, or nobody stopped the job: the test fails on the missing restart
    touch(os.path.join(args.state_dir, f"done-rank{rank}-{pid}"), str(step))
    print(f"rank {rank} done after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
