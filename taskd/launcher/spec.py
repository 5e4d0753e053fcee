"""What to launch: the description of one node's ranks, shared by the launcher and the agent."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from taskd.callbacks import STATUS_FAILED, STATUS_NOT_STARTED, STATUS_OK, STATUS_RUNNING  # noqa: F401 (re-exported)


def command_for(script: str, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``script``: a ``.py`` file through this interpreter (unbuffered), else the executable."""
    if script.endswith(".py"):
        return [sys.executable, "-u", script, *args]
    return [script, *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (for a single-node job's MASTER_PORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class WorkerSpec:
    """The ranks of one node.

    ``entrypoint`` is the full argv of a rank (see :func:`command_for`). With
    ``master_port=0`` the launcher picks a free port. ``log_dir=None`` keeps no
    log files (output still reaches the console with ``console=True`` and
    :meth:`LocalLauncher.tail_log`). ``run_dir=None`` makes a private temporary
    directory for the heartbeat files, removed by ``close()``.
    """

    entrypoint: list[str]
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    job_id: str = "default"
    log_dir: str | None = None
    run_dir: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    console: bool = False
    cwd: str | None = None
    warm_spares: int = 0  # idle interpreters kept ready to become a restarted rank (.py entrypoints only)

    def __post_init__(self) -> None:
        if isinstance(self.entrypoint, (str, bytes)) or not self.entrypoint:
            raise ValueError("entrypoint must be a non-empty argv list, e.g. command_for('train.py', args)")
        self.entrypoint = [os.fspath(a) for a in self.entrypoint]
        for name in ("nproc_per_node", "nnodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank!r}")
        if not isinstance(self.master_port, int) or not 0 <= self.master_port <= 65535:
            raise ValueError(f"master_port must be in [0, 65535], got {self.master_port!r}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank
