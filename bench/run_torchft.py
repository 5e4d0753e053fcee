"""torchft's deployment of a DDP job as bench/peers.py runs it: one Lighthouse, one torchrun per replica.

    python bench/run_torchft.py --replicas N [--nproc-per-replica P] [--min-replicas M] [--max-restarts 3]
        SCRIPT ARGS...

The Lighthouse runs in this process (torchft's `LighthouseServer`, quorum of all N replicas); each
replica group is P ranks (1 unless told) under its own `torchrun --standalone --nproc-per-node P --max-restarts K`
(torchft's documented layout: a replica's torchrun restarts only that replica). Exits with the
highest exit code of the replicas; SIGTERM stops them all.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, required=True)
    p.add_argument("--nproc-per-replica", type=int, default=1, help="ranks per replica group (HSDP: its shards)")
    p.add_argument("--min-replicas", type=int, default=0,
                   help="the Lighthouse's quorum minimum (0: every replica; HSDP goes on with fewer: 1)")
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                   help="the Lighthouse's: a replica silent this long is out of the next quorum")
    p.add_argument("--join-timeout-ms", type=int, default=1000)
    p.add_argument("--quorum-tick-ms", type=int, default=50)
    p.add_argument("--timeout", type=int, default=5,
                   help="TORCHFT_TIMEOUT_SEC, whole seconds: the collectives' and the Manager's timeout "
                        "(torchft's train_ddp.py: 5)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=a.min_replicas or a.replicas,
                                  join_timeout_ms=a.join_timeout_ms, quorum_tick_ms=a.quorum_tick_ms,
                                  heartbeat_timeout_ms=a.heartbeat_timeout_ms)
    procs: list[subprocess.Popen[bytes]] = []

    def stop(*_: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        lighthouse.shutdown()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    for r in range(a.replicas):
        env = {**os.environ, "REPLICA_GROUP_ID": str(r), "NUM_REPLICA_GROUPS": str(a.replicas),
               "TORCHFT_LIGHTHOUSE": lighthouse.address(), "TORCHFT_TIMEOUT_SEC": str(a.timeout)}
        procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc-per-node", str(a.nproc_per_replica),
                                       "--max-restarts", str(a.max_restarts), a.script, *a.args], env=env))
    codes = [proc.wait() for proc in procs]
    lighthouse.shutdown()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
