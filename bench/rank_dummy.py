"""A dummy rank for the benchmarks: records when it starts and when it is told to stop, then idles.

Run under `taskd run` or torchrun. Appends JSON lines to ``$BENCH_RANK_LOG`` (O_APPEND writes
of one line are atomic): ``{"event": "start"|"term", "rank", "pid", "t", "restart"}``.
Prints one line at start (the "first output line" of the recovery benchmark).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

T0 = time.time()


def record(event: str, t: float) -> None:
    path = os.environ.get("BENCH_RANK_LOG")
    if not path:
        return
    line = json.dumps({"event": event, "rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "t": t,
                       "restart": int(os.environ.get("TASKD_RESTART_COUNT", os.environ.get("TORCHELASTIC_RESTART_COUNT",
                                                                                            "0")))})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def on_term(signum: int, _frame: object) -> None:
    record("term", time.time())
    os._exit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, on_term)
    # independent ranks: under taskd the agent offers `recover` only to ranks that declared this (before the
    # start record, which the benchmarks wait for before they kill; T0 above is unaffected)
    from taskd.worker import declare_rejoinable

    declare_rejoinable()
    record("start", T0)
    print(f"rank {os.environ.get('RANK', '0')} pid {os.getpid()} up", flush=True)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3600.0
    time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
