"""Hosting ``torch.distributed.TCPStore(is_master=True)`` in a child process the owner reaps.

The child runs the ranks' interpreter and imports torch; the owner (agent or launcher) never
does. It dies with its owner twice over: PR_SET_PDEATHSIG (through ``taskd.process.spawn``; like
a rank, spawn it from a thread that lives as long as the owner) and end-of-file on its stdin.

The owner binds the listening socket itself (:func:`listen`) and hands it to the child over its
stdin, a Unix socket (SCM_RIGHTS). So a port in use is a clear error before anything starts, the
ranks can be started at the same time as the child (their connections wait in the socket's
backlog until it serves; they need the store only at ``init_process_group``, after their own
``import torch``), and a store that has to be started again gets the very same socket.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

from taskd.process.pidfd import wait_readable
from taskd.process.spawn import kill_group, reap, spawn
from taskd.worker.env import Var

log = logging.getLogger(__name__)

READY = "TASKD_STORE_READY"

# Runs in the child (`python -c CODE host port timeout`), its stdin a Unix socket that carries the listening
# socket (SCM_RIGHTS). It prints READY and the port, stops writing to the pipe (nobody reads it afterwards),
# then serves until its stdin closes.
CHILD_CODE = r"""
import os, socket, sys
from datetime import timedelta
ctl = socket.socket(fileno=0)
_, fds, _, _ = socket.recv_fds(ctl, 16, 1)
if not fds:
    sys.exit("no listening socket was handed over")
import torch.distributed as dist
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout),
                      master_listen_fd=fds[0])
sys.stdout.write(f"TASKD_STORE_READY {store.port}\n")
sys.stdout.flush()
_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
while ctl.recv(65536):
    pass
"""


class StoreHostError(OSError):
    """The store could not be started (port taken, torch missing, not ready in time); str() says why."""


def port_in_use(port: int) -> str:
    """What to tell a user whose MASTER_PORT is taken, wherever it is found (here, launcher/ports.py)."""
    return (f"rendezvous store: port {port} is already in use (another job's store or rank 0, e.g. a second "
            f"job on the default MASTER_PORT?): give this job a free port with --master-port (or "
            f"--rdzv-endpoint HOST:PORT), or stop the other job")


def listen(port: int, host: str = "") -> socket.socket:
    """Bind and listen on ``port`` (0: a free one) on every interface, as TCPStore's server does.

    Raises StoreHostError naming the port and what to do when it is taken (e.g. two jobs on 29500).
    """
    if not 0 <= port < 65536:
        raise StoreHostError(f"store port must be 0..65535, got {port}")
    try:
        if not host and socket.has_dualstack_ipv6():
            sock = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024)
        else:
            sock = socket.create_server((host, port), backlog=1024)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StoreHostError(port_in_use(port)) from None
        raise StoreHostError(f"rendezvous store: cannot listen on port {port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    return sock


class StoreHost:
    """A running store child; ``start()`` it, hand :func:`store_env` to the ranks, ``close()`` it."""

    def __init__(self, popen: subprocess.Popen[bytes], host: str, port: int,
                 control: socket.socket | None = None) -> None:
        self.popen = popen
        self.host = host
        self.port = port
        self._control = control  # our end of the child's stdin: closing it stops the child
        self.ready = control is None  # spawn() returns before the child serves; wait_ready() confirms

    @property
    def pid(self) -> int:
        return self.popen.pid

    @classmethod
    def start(cls, host: str = "0.0.0.0", port: int = 0, timeout: float = 30.0, python: str | None = None,
              env: Mapping[str, str] | None = None, store_timeout: float = 300.0) -> StoreHost:
        """Start the store on ``port`` (0: a free port; see ``.port``) and wait until it serves.

        ``python`` is the ranks' interpreter (default: this one). Raises StoreHostError naming the
        cause when the port is taken, or with the child's output when it exits or is not ready
        within ``timeout`` seconds.
        """
        sock = listen(port)
        try:
            host_ = cls.spawn(sock, host, python=python, env=env, store_timeout=store_timeout)
        finally:
            sock.close()
        host_.wait_ready(timeout)
        return host_

    @classmethod
    def spawn(cls, sock: socket.socket, host: str = "0.0.0.0", python: str | None = None,
              env: Mapping[str, str] | None = None, store_timeout: float = 300.0) -> StoreHost:
        """Start a child serving the listening ``sock`` (see :func:`listen`; the caller keeps its copy)
        and return at once; :meth:`wait_ready` confirms it serves."""
        port = sock.getsockname()[1]
        argv = [python or sys.executable, "-u", "-c", CHILD_CODE, host, str(port), str(store_timeout)]
        ours, theirs = socket.socketpair()
        try:
            popen = spawn(argv, dict(os.environ if env is None else env), stdin=theirs.fileno())
        except OSError as exc:
            ours.close()
            raise StoreHostError(f"cannot start the rendezvous store: {exc}") from exc
        finally:
            theirs.close()
        try:
            socket.send_fds(ours, [b"L"], [sock.fileno()])
        except OSError as exc:  # the child died at once
            cls._discard(popen)
            ours.close()
            raise StoreHostError(f"cannot hand the listening socket to the rendezvous store: {exc}") from exc
        return cls(popen, host, port, ours)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the child serves; StoreHostError with its output if it exits or takes longer than ``timeout``."""
        if self.ready:
            return
        popen = self.popen
        assert popen.stdout is not None
        deadline = time.monotonic() + timeout
        output = b""
        said = b""  # what the child printed before READY (a warning, or the traceback of its failure)
        fd = popen.stdout.fileno()
        where = f"rendezvous store on port {self.port}"
        while b"\n" not in output or not output.startswith(READY.encode()):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not wait_readable(fd, remaining):
                self.close(timeout=0)
                raise StoreHostError(f"{where} not ready within {timeout:.0f}s: "
                                     f"{(said + output).decode(errors='replace').strip()[-2000:]}")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.close(timeout=0)
                why = (said + output).decode(errors="replace").strip()[-2000:] or "no output"
                raise StoreHostError(f"{where} exited ({popen.returncode}): {why}")
            output += chunk
            while not output.startswith(READY.encode()[: len(output)]) and b"\n" in output:
                # not our line first: keep it for an error message; the READY line must follow
                line, _, output = output.partition(b"\n")
                said += line + b"\n"
                log.debug("rendezvous store: %s", line.decode(errors="replace"))
        self.ready = True
        log.debug("rendezvous store pid %d serving on port %d", popen.pid, self.port)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the store and reap it (EOF first, SIGKILL after ``timeout``); safe to call twice."""
        popen = self.popen
        if self._control is not None:
            self._control.close()
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
        reap(popen, "rendezvous store")

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
