"""Hosting ``torch.distributed.TCPStore(is_master=True)`` in a child process the owner reaps.

The child runs the ranks' interpreter and imports torch; the owner (agent or launcher) never
does. It dies with its owner twice over: PR_SET_PDEATHSIG (through ``taskd.process.spawn``; like
a rank, spawn it from a thread that lives as long as the owner) and end-of-file on its stdin.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping

from taskd.process.pidfd import wait_readable
from taskd.process.spawn import kill_group, spawn
from taskd.worker.env import Var

log = logging.getLogger(__name__)

READY = "TASKD_STORE_READY"

# Runs in the child (`python -c CODE host port timeout`). It prints READY and the bound port, stops
# writing to the pipe (nobody reads it afterwards), then serves until its stdin closes.
CHILD_CODE = r"""
import os, sys
from datetime import timedelta
import torch.distributed as dist
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
sys.stdout.write(f"TASKD_STORE_READY {store.port}\n")
sys.stdout.flush()
_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
while sys.stdin.buffer.read(65536):
    pass
"""


class StoreHostError(RuntimeError):
    """The store could not be started (port taken, torch missing, not ready in time)."""


class StoreHost:
    """A running store child; ``start()`` it, hand :func:`store_env` to the ranks, ``close()`` it."""

    def __init__(self, popen: subprocess.Popen[bytes], host: str, port: int) -> None:
        self.popen = popen
        self.host = host
        self.port = port

    @property
    def pid(self) -> int:
        return self.popen.pid

    @classmethod
    def start(cls, host: str = "0.0.0.0", port: int = 0, timeout: float = 30.0, python: str | None = None,
              env: Mapping[str, str] | None = None, store_timeout: float = 300.0) -> StoreHost:
        """Start the store on ``host:port`` (0: a free port; see ``.port``) and wait until it serves.

        ``python`` is the ranks' interpreter (default: this one). Raises StoreHostError with the
        child's output when it exits or is not ready within ``timeout`` seconds.
        """
        if not 0 <= port < 65536:
            raise StoreHostError(f"store port must be 0..65535, got {port}")
        argv = [python or sys.executable, "-u", "-c", CHILD_CODE, host, str(port), str(store_timeout)]
        try:
            popen = spawn(argv, dict(os.environ if env is None else env), stdin=subprocess.PIPE)
        except OSError as exc:
            raise StoreHostError(f"cannot start the rendezvous store: {exc}") from exc
        assert popen.stdout is not None
        deadline = time.monotonic() + timeout
        output = b""
        fd = popen.stdout.fileno()
        while b"\n" not in output or not output.startswith(READY.encode()):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not wait_readable(fd, remaining):
                cls._discard(popen)
                raise StoreHostError(f"rendezvous store on {host}:{port} not ready within {timeout:.0f}s: "
                                     f"{output.decode(errors='replace').strip()[-2000:]}")
            chunk = os.read(fd, 65536)
            if not chunk:
                cls._discard(popen)
                raise StoreHostError(f"rendezvous store on {host}:{port} exited "
                                     f"({popen.returncode}): {output.decode(errors='replace').strip()[-2000:]}")
            output += chunk
            if not output.startswith(READY.encode()[: len(output)]) and b"\n" in output:
                # not our line first: keep reading (e.g. a warning); the READY line must follow
                line, _, output = output.partition(b"\n")
                log.debug("rendezvous store: %s", line.decode(errors="replace"))
        bound = int(output.split(b"\n", 1)[0].split()[1])
        log.debug("rendezvous store pid %d serving on %s:%d", popen.pid, host, bound)
        return cls(popen, host, bound)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the store and reap it (EOF first, SIGKILL after ``timeout``); safe to call twice."""
        popen = self.popen
        if popen.stdin is not None and not popen.stdin.closed:
            try:
                popen.stdin.close()
            except OSError:
                pass
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(popen.pid)
            self._discard(popen)
        if popen.stdout is not None:
            popen.stdout.close()

    @staticmethod
    def _discard(popen: subprocess.Popen[bytes]) -> None:
        kill_group(popen.pid)
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("rendezvous store %d did not die within 5 s of SIGKILL", popen.pid)
        for stream in (popen.stdin, popen.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def env(self, addr: str | None = None) -> dict[str, str]:
        """The ranks' variables for this store; ``addr`` is how ranks reach it (default: its host)."""
        host = addr or (self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        return store_env(host, self.port)

    def __enter__(self) -> StoreHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def store_env(addr: str, port: int) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT of an agent-hosted store, and the torchelastic flag that makes every rank a client.

    With it a plain ``init_process_group()`` (env://) connects to the store instead of rank 0
    hosting one. torch adds no per-attempt key prefix in that mode, so the owner restarts the
    store for a whole-job restart (job-rescheduling) as torchelastic does; live-recovering ranks
    use a prefix per generation instead (``taskd.worker.live.STORE_PREFIX``).
    """
    return {Var.MASTER_ADDR: addr, Var.MASTER_PORT: str(port), Var.TORCHELASTIC_USE_AGENT_STORE: "True"}
