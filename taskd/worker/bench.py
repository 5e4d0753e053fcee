"""Cost per call of the worker SDK's hot paths: ``python -m taskd.worker.bench [--calls N]``.

Prints one line per measurement (microseconds per call), for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable


def _per_call(fn: Callable[[int], object], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args(argv)

    from taskd.worker import progress
    from taskd.worker.env import Var
    from taskd.worker.heartbeat_file import HeartbeatFile

    os.environ.pop(Var.TASKD_HEARTBEAT_FILE, None)
    os.environ.pop(Var.TASKD_HEARTBEAT_DIR, None)
    progress.reattach()
    noop = _per_call(progress.heartbeat, args.calls)

    with tempfile.TemporaryDirectory(prefix="taskd-bench-") as tmp:
        path = os.path.join(tmp, "rank_0.hb")
        agent = HeartbeatFile(path).create().open()
        os.environ[Var.TASKD_HEARTBEAT_FILE] = path
        progress.reattach()
        progress.heartbeat(0)  # attach
        beat = _per_call(progress.heartbeat, args.calls)

        def enter_exit(_: int) -> None:
            with progress.section("bench", timeout=10):
                pass

        sec = _per_call(enter_exit, max(1, args.calls // 10))
        read = _per_call(lambda _: agent.read(), max(1, args.calls // 10))
        agent.close()
        os.environ.pop(Var.TASKD_HEARTBEAT_FILE, None)

    print(f"heartbeat() without taskd: {noop:.3f} us/call")
    print(f"heartbeat(step) under taskd: {beat:.3f} us/call")
    print(f"section() enter+exit under taskd: {sec:.3f} us/call")
    print(f"HeartbeatFile.read() (agent side): {read:.3f} us/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
