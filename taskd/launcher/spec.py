"""What to launch: the description of one node's ranks, shared by the launcher and the agent."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from taskd.launcher.snapshots import is_memory
from taskd.settings import WARM_SPARE_MODES, default


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


# The `taskd run` flag each field usually comes from, named in every problem found with it.
# What a live job's warm spare imports before it becomes a rank: torch, and torch._dynamo, which the first
# torch.optim optimizer imports (seconds on 2 cores: bench/live_recovery.py's profile in BENCHMARKS.md), and
# LiveGroup's module (17 ms more of a prepared replacement's path before its model is built, otherwise).
LIVE_PREIMPORT = "torch,torch._dynamo,taskd.worker.torch"

FLAGS = {
    "entrypoint": "SCRIPT [ARGS]", "nproc_per_node": "--nproc-per-node", "nnodes": "--nnodes",
    "node_rank": "--node-rank", "master_addr": "--master-addr", "master_port": "--master-port",
    "job_id": "--job-id", "log_dir": "--log-dir", "console": "--quiet", "warm_spares": "--warm-spares",
    "role": "--role", "max_restarts": "--max-restarts", "redirects": "--redirects", "tee": "--tee",
    "local_ranks_filter": "--local-ranks-filter", "warm_spare_mode": "--warm-spare-mode",
    "snapshot_memory": "--snapshot-memory", "snapshot_persist_dir": "--snapshot-persist-dir",
    "snapshot_persist_every": "--snapshot-persist-every", "snapshot_persist_keep": "--snapshot-persist-keep",
    "rdzv_store": "TASKD_RDZV_STORE", "preimport": "TASKD_PREIMPORT",
}
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3  # torchrun's Std: which of stdout/stderr a setting covers

Streams = int | Mapping[int, int]  # one value for every local rank, or {local_rank: value} (others 0)


class WorkerSpecError(ValueError):
    """A WorkerSpec that cannot launch; ``problems`` has one line per bad field, naming it and its flag."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid WorkerSpec: " + "; ".join(self.problems))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class WorkerSpec:
    """The ranks of one node, checked when built (:class:`WorkerSpecError` names every bad field).

    ``entrypoint`` is the full argv of a rank (see :func:`command_for`). With
    ``master_port=0`` the launcher picks a free port. ``log_dir=None`` keeps no
    log files (output still reaches the console with ``console=True`` and
    :meth:`LocalLauncher.tail_log`). ``run_dir=None`` makes a private temporary
    directory for the heartbeat and error files, removed by ``close()``.
    ``redirects``/``tee`` are torchrun's: 0 none, 1 stdout, 2 stderr, 3 both, for every
    local rank or as ``{local_rank: value}``; see docs/launcher.md ("Output").
    ``local_ranks_filter`` (torchrun's ``--local-ranks-filter``): only these local ranks' output
    reaches the console (``None``: every rank's); their log files keep everything either way.
    """

    entrypoint: list[str]
    nproc_per_node: int = default("ranks_per_node")
    nnodes: int = default("node_count")
    # None: a standby's, set once the controller assigns one (LocalLauncher.set_node_rank)
    node_rank: int | None = default("node_rank")
    master_addr: str = default("master_addr")
    master_port: int = default("master_port")
    job_id: str = "default"
    log_dir: str | None = None
    run_dir: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    console: bool = False
    cwd: str | None = None
    warm_spares: int = default("warm_spares")  # interpreters ready to become a restarted rank (.py only)
    snapshot_memory: str | None = None  # the snapshots' cap on this node (None: TASKD_SNAPSHOT_MEMORY or its default)
    snapshot_persist_dir: str | None = None  # where the agent persists the snapshots (None: memory only)
    snapshot_persist_every: int = default("snapshot_persist_every")  # persist every Nth step's snapshot
    snapshot_persist_keep: int = default("snapshot_persist_keep")  # persisted steps kept per rank
    warm_spare_mode: str = default("warm_spare_mode")  # WARM_SPARE_MODES ("script": up to become_rank())
    role: str = default("role")  # torchrun's ROLE_NAME
    max_restarts: int = 0  # the job's restart budget, given to ranks as TORCHELASTIC_MAX_RESTARTS
    redirects: Streams = STD_NONE  # streams that go to the log file only, not the console
    tee: Streams = STD_NONE  # streams that go to the log file and the console
    local_ranks_filter: Collection[int] | None = None  # local ranks shown on the console; None = all
    # live recovery: "agent" hosts the rendezvous store on node 0 and turns live recovery on; "auto" does so
    # when the entrypoint is a .py script that imports taskd.worker.torch (taskd run's default); "rank": rank 0
    # hosts it, as under torchrun
    rdzv_store: str = "rank"
    preimport: str = default("preimport")  # what warm spares import first (live jobs: LIVE_PREIMPORT)

    def __post_init__(self) -> None:
        problems: list[str] = []

        def bad(name: str, what: str) -> None:
            flag = FLAGS.get(name)
            problems.append(f"{name}{f' ({flag})' if flag else ''} {what}, got {getattr(self, name)!r}")

        if isinstance(self.entrypoint, (str, bytes)) or not isinstance(self.entrypoint, Sequence) \
                or not self.entrypoint:
            bad("entrypoint", "must be a non-empty argv list, e.g. command_for('train.py', args)")
        else:
            self.entrypoint = [os.fspath(a) for a in self.entrypoint]
        for name in ("nproc_per_node", "nnodes"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad(name, "must be a positive integer")
        if _is_int(self.nnodes) and self.node_rank is not None and \
                (not _is_int(self.node_rank) or not 0 <= self.node_rank < max(1, self.nnodes)):
            bad("node_rank", f"must be in [0, {self.nnodes}) for nnodes={self.nnodes}")
        if not _is_int(self.master_port) or not 0 <= self.master_port <= 65535:
            bad("master_port", "must be in [0, 65535] (0: pick a free port)")
        if not isinstance(self.master_addr, str) or not self.master_addr.strip():
            bad("master_addr", "must be a host name or address")
        for name in ("job_id", "role"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or not value.isprintable():
                bad(name, "must be a non-empty printable string")
        for name in ("log_dir", "run_dir", "cwd"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                bad(name, "must be a path or None")
            elif value is not None:
                setattr(self, name, os.fspath(value))
        if not isinstance(self.extra_env, Mapping):
            bad("extra_env", "must be a mapping of variable names to values")
        if self.rdzv_store not in ("auto", "agent", "rank"):
            bad("rdzv_store", "must be auto, agent or rank")
        if self.warm_spare_mode not in WARM_SPARE_MODES:
            bad("warm_spare_mode", f"must be {' or '.join(WARM_SPARE_MODES)}")
        if self.snapshot_memory is not None and not is_memory(self.snapshot_memory):
            bad("snapshot_memory", "must be bytes, e.g. 2G, 512M or 1000000")
        if not isinstance(self.preimport, str):
            bad("preimport", "must be comma-separated module names")
        for name in ("warm_spares", "max_restarts"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                bad(name, "must be an integer >= 0")
        for name in ("snapshot_persist_every", "snapshot_persist_keep"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                bad(name, "must be an integer >= 1")
        if self.snapshot_persist_dir is not None and (not isinstance(self.snapshot_persist_dir, (str, os.PathLike))
                                                      or not os.fspath(self.snapshot_persist_dir)):
            bad("snapshot_persist_dir", "must be a directory path or None")
        for name in ("redirects", "tee"):
            why = self._streams_problem(getattr(self, name))
            if why:
                bad(name, why)
            else:
                value = getattr(self, name)
                setattr(self, name, value if _is_int(value) else {int(k): int(v) for k, v in value.items()})
        if self.local_ranks_filter is not None:
            ranks = self.local_ranks_filter
            if isinstance(ranks, (str, bytes, Mapping)) or not isinstance(ranks, Collection) or not ranks \
                    or not all(_is_int(r) and r >= 0 for r in ranks):
                bad("local_ranks_filter", "must be None or a non-empty set of local ranks (integers >= 0)")
            else:  # ranks >= nproc_per_node show nothing, as under torchrun (one line for nodes of any size)
                self.local_ranks_filter = frozenset(ranks)
        if problems:
            raise WorkerSpecError(problems)

    def _streams_problem(self, value: object) -> str:
        """'' if ``value`` is a valid redirects/tee setting, else why not."""
        if _is_int(value):
            return "" if STD_NONE <= value <= STD_ALL else "must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
        if not isinstance(value, Mapping):
            return "must be 0-3 or a {local_rank: 0-3} mapping"
        nproc = self.nproc_per_node if _is_int(self.nproc_per_node) else 0
        for rank, bits in value.items():
            if not _is_int(rank) or not 0 <= rank < nproc:
                return f"maps {rank!r}, which is not a local rank (0..{nproc - 1})"
            if not _is_int(bits) or not STD_NONE <= bits <= STD_ALL:
                return f"maps local rank {rank} to {bits!r}: must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"
        return ""

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        if self.node_rank is None:
            raise RuntimeError("a standby has no node rank yet: its ranks have no global rank until it is assigned one")
        return self.node_rank * self.nproc_per_node + local_rank

    def streams_of(self, local_rank: int) -> tuple[int, int]:
        """(redirects, tee) of one local rank, as torchrun's bit sets (ranks a mapping leaves out get 0)."""
        return _bits(self.redirects, local_rank), _bits(self.tee, local_rank)

    def console_streams(self, local_rank: int) -> tuple[bool, bool]:
        """Whether the rank's (stdout, stderr) reach the console.

        Never for a rank outside ``local_ranks_filter``; a redirected stream only when tee'd.
        """
        if not self.console or (self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter):
            return False, False
        redirects, tee = self.streams_of(local_rank)
        return (not redirects & STD_OUT or bool(tee & STD_OUT)), (not redirects & STD_ERR or bool(tee & STD_ERR))

    def redirects_any(self) -> bool:
        """Whether some rank's output goes to a file only or also (then it needs a log directory)."""
        return any(any(self.streams_of(r)) for r in range(self.nproc_per_node))


def _bits(value: Streams, local_rank: int) -> int:
    return value if isinstance(value, int) else int(value.get(local_rank, STD_NONE))
