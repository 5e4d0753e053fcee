"""Whether a node's ranks get an agent-hosted store, and hosting it on node 0 (live recovery).

Live recovery needs a store that outlives rank 0, so node 0's ``taskd run`` hosts the
``MASTER_ADDR:MASTER_PORT`` store, as torchrun's agent does, when the entry script uses taskd's
live binding: the entry script, ``-m`` module or ``--no-python`` command's script imports ``taskd.worker.torch``,
itself or through modules of its own (a static look, live_binding.py, which says why plain scripts must not get
this store), and torch is importable in the ranks' interpreter (mode ``auto``). Any other script (a plain
env:// DDP script, a MindSpore script) keeps MASTER_PORT to itself: rank 0 hosts the store, as under
plain ``init_process_group``. ``TASKD_RDZV_STORE=agent`` forces the agent store, ``rank`` turns it off.

The store lives as long as the job: it is never restarted for a whole-job restart, which a
multi-node job's other nodes could race. Every group forms under a key prefix of its own,
``taskd/gen<g>``, with ``g`` the controller's round number, known to every node (TASKD_GENERATION).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import sys

from taskd.rendezvous.live_binding import uses_live_binding
from taskd.rendezvous.store import StoreHost, listen, store_env
from taskd.worker.env import Var

log = logging.getLogger(__name__)

MODES = ("auto", "agent", "rank")
CONTROL_FILE = "control.json"


def torch_importable(python: str | None = None) -> bool:
    """Whether ``python`` (default: this interpreter) can import torch, without importing it here."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("torch") is not None
    try:
        probe = subprocess.run([python, "-c", "import importlib.util, sys; "
                                "sys.exit(importlib.util.find_spec('torch') is None)"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"rendezvous store mode (TASKD_RDZV_STORE) must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


class AgentStore:
    """The live-recovery setup of one node: the store (hosted on node 0 only), the control file, the ranks' env.

    Node 0 binds the store's port when this is built, so a port in use fails before any rank
    starts (StoreHostError). ``start()`` is called for every whole-node start (job start and
    job-rescheduling): it starts the store child if it is not running (at once, without waiting;
    ``confirm()`` waits for it once the ranks are started) and removes the control file. Call both
    from the thread that owns the ranks (PR_SET_PDEATHSIG, see StoreHost).
    """

    def __init__(self, enabled: bool, node_rank: int, addr: str, port: int, run_dir: str,
                 python: str | None = None) -> None:
        self.enabled = enabled
        self.hosts = enabled and node_rank == 0
        self.addr = addr
        self.python = python
        self.control_path = os.path.join(run_dir, CONTROL_FILE) if enabled else None
        self.host: StoreHost | None = None
        self.starts = 0
        self._sock: socket.socket | None = listen(port) if self.hosts else None
        self.port = self._sock.getsockname()[1] if self._sock is not None else port

    @classmethod
    def decide(cls, mode: str, script: str | None, node_rank: int, addr: str, port: int, run_dir: str,
               python: str | None = None, cwd: str | None = None) -> AgentStore:
        """``script``: the file the ranks' Python runs first (a ``.py``, a ``-m`` module's source, the script a
        ``--no-python`` command runs), None when unknown; its own modules are looked for beside it and in ``cwd``."""
        mode = check_mode(mode)
        enabled = mode == "agent" or (mode == "auto" and script is not None and uses_live_binding(script, cwd)
                                      and torch_importable(python))
        return cls(enabled, node_rank, addr, port, run_dir, python)

    def start(self) -> None:
        """Start the store on node 0 unless it runs, and clear the control file; a no-op when live recovery is off."""
        if not self.enabled:
            return
        assert self.control_path is not None
        try:
            os.unlink(self.control_path)
        except FileNotFoundError:
            pass
        if self._sock is None or (self.host is not None and self.host.alive()):
            return
        if self.host is not None:
            log.warning("rendezvous store (pid %d) had exited: starting it again on port %d", self.host.pid,
                        self.port)
            self.host.close(timeout=0)
        self.host = StoreHost.spawn(self._sock, "0.0.0.0", python=self.python)
        self.starts += 1
        log.debug("rendezvous store (pid %d) on port %d, start %d", self.host.pid, self.port, self.starts)

    def confirm(self, timeout: float = 60.0) -> None:
        """Wait until the store started by ``start()`` serves (StoreHostError with its output if it does not)."""
        if self.host is not None:
            self.host.wait_ready(timeout)

    def env(self, generation: int) -> dict[str, str]:
        """What a rank started into ``generation`` gets on top of the launcher's variables (empty when off)."""
        if not self.enabled:
            return {}
        assert self.control_path is not None
        return {**store_env(self.addr, self.port), Var.TASKD_CONTROL_FILE: self.control_path,
                Var.TASKD_GENERATION: str(generation)}

    def pids(self) -> set[int]:
        return {self.host.pid} if self.host is not None and self.host.alive() else set()

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
