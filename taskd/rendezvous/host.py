"""Whether a node's ranks get an agent-hosted store, and hosting it on node 0 (live recovery).

torchrun's agent hosts the ``MASTER_ADDR:MASTER_PORT`` store, so that is what ``taskd run`` does
too whenever the ranks can be torch ranks: a ``.py`` entrypoint and torch importable in the
ranks' interpreter (mode ``auto``). ``TASKD_RDZV_STORE=agent`` forces it, ``rank`` turns it off
(rank 0 hosts the store, as under plain ``init_process_group``; no live recovery then).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys

from taskd.rendezvous.store import StoreHost, store_env
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

    ``start()`` is called for every whole-node start (job start and job-rescheduling): it
    restarts the store so a whole-job restart finds no keys of the last one, and removes the
    control file. Call it from the thread that owns the ranks (PR_SET_PDEATHSIG, see StoreHost).
    """

    def __init__(self, enabled: bool, node_rank: int, addr: str, port: int, run_dir: str,
                 python: str | None = None) -> None:
        self.enabled = enabled
        self.hosts = enabled and node_rank == 0
        self.addr = addr
        self.port = port
        self.python = python
        self.control_path = os.path.join(run_dir, CONTROL_FILE) if enabled else None
        self.host: StoreHost | None = None
        self.starts = 0

    @classmethod
    def decide(cls, mode: str, python_entry: bool, node_rank: int, addr: str, port: int, run_dir: str,
               python: str | None = None) -> AgentStore:
        mode = check_mode(mode)
        enabled = mode == "agent" or (mode == "auto" and python_entry and torch_importable(python))
        return cls(enabled, node_rank, addr, port, run_dir, python)

    def start(self) -> None:
        """(Re)start the store on node 0 and clear the control file; a no-op when live recovery is off."""
        if not self.enabled:
            return
        assert self.control_path is not None
        try:
            os.unlink(self.control_path)
        except FileNotFoundError:
            pass
        if not self.hosts:
            return
        if self.host is not None:
            self.host.close()
            self.host = None
        self.host = StoreHost.start(self.addr, self.port, timeout=60.0, python=self.python)
        self.starts += 1
        log.debug("rendezvous store (pid %d) on %s:%d, start %d", self.host.pid, self.addr, self.port, self.starts)

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
