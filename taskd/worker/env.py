"""Where this rank stands in the job, read from whichever launcher started it (taskd, torchrun or msrun).

Outside any launcher the answers describe a single-process job (rank 0 of 1), so a
script runs unchanged on a laptop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Var:
    """Names of the variables a launcher gives each rank, in one place.

    ``taskd.launcher.env`` writes them and the functions below read them; both use these
    constants, so renaming one cannot leave the writer and the reader disagreeing.
    """

    # MindSpore msrun
    RANK_ID = "RANK_ID"
    RANK_SIZE = "RANK_SIZE"
    DEVICE_ID = "DEVICE_ID"
    MS_WORKER_NUM = "MS_WORKER_NUM"
    MS_NODE_ID = "MS_NODE_ID"
    MS_ROLE = "MS_ROLE"
    MS_SCHED_HOST = "MS_SCHED_HOST"
    MS_SCHED_PORT = "MS_SCHED_PORT"
    # torchrun
    RANK = "RANK"
    LOCAL_RANK = "LOCAL_RANK"
    WORLD_SIZE = "WORLD_SIZE"
    LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
    GROUP_RANK = "GROUP_RANK"
    MASTER_ADDR = "MASTER_ADDR"
    MASTER_PORT = "MASTER_PORT"
    TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # job-wide: the same on every rank started together
    TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
    TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
    TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # where torch's @record writes a rank's exception
    GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
    ROLE_NAME = "ROLE_NAME"
    ROLE_RANK = "ROLE_RANK"
    ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
    OMP_NUM_THREADS = "OMP_NUM_THREADS"
    TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": the store outlives rank 0
    # taskd
    TASKD_RESTART_COUNT = "TASKD_RESTART_COUNT"
    TASKD_JOB_ID = "TASKD_JOB_ID"
    TASKD_HEARTBEAT_FILE = "TASKD_HEARTBEAT_FILE"
    TASKD_HEARTBEAT_DIR = "TASKD_HEARTBEAT_DIR"  # set by an agent for ranks another launcher starts
    TASKD_CONTROL_FILE = "TASKD_CONTROL_FILE"  # live recovery: the agent's per-node control file
    TASKD_AGENT_BELL = "TASKD_AGENT_BELL"  # the agent's doorbell (a Unix datagram socket): `ring_agent`
    TASKD_GENERATION = "TASKD_GENERATION"  # live recovery: the group generation a rank starts into
    TASKD_JOIN_AFTER = "TASKD_JOIN_AFTER"  # live: started before its generation was named: the first named above this
    TASKD_REJOIN_TIMEOUT = "TASKD_REJOIN_TIMEOUT"  # live recovery: seconds a rank waits for a generation
    TASKD_PREIMPORT = "TASKD_PREIMPORT"  # warm spares: modules to import before becoming a rank
    TASKD_SPARE = "TASKD_SPARE"  # "1": a warm spare running the script before it is a rank (taskd.worker.spare)
    TASKD_SPARE_ARGV = "TASKD_SPARE_ARGV"  # such a spare's script and arguments (JSON)
    TASKD_SNAPSHOT_DIR = "TASKD_SNAPSHOT_DIR"  # snapshots: the job's directory in /dev/shm, the node's agent owns it
    TASKD_SNAPSHOT_BYTES = "TASKD_SNAPSHOT_BYTES"  # snapshots: this rank's share of the job's host-memory cap
    TASKD_SNAPSHOT_MEMORY = "TASKD_SNAPSHOT_MEMORY"  # snapshots: the cap per job and node (taskd run's environment)
    TASKD_SNAPSHOT_PINS = "TASKD_SNAPSHOT_PINS"  # snapshots: segments of a rank the agent's copiers may hold at once
    TASKD_SNAPSHOT_FAULT = "TASKD_SNAPSHOT_FAULT"  # tests: "kill-in-copy:RANK:STEP", a rank SIGKILLed mid-copy
    TASKD_SNAPSHOT_PERSIST_DIR = "TASKD_SNAPSHOT_PERSIST_DIR"  # snapshots: the agent's persisted copies (restore)
    TASKD_SNAPSHOT_PERSIST_FAULT = "TASKD_SNAPSHOT_PERSIST_FAULT"  # tests: "slow-disk:SECONDS" before each fsync
    MINDX_TASK_ID = "MINDX_TASK_ID"  # TaskD's job id, when the job runs under MindCluster


CREDENTIAL_VARS = frozenset({"TASKD_TOKEN_FILE", "TASKD_TOKEN", "TASKD_TLS_CA", "TASKD_TLS_CERT", "TASKD_TLS_KEY"})
"""What names or holds a controller credential: the agent reads them; a rank never inherits them."""


def is_credential_var(name: str) -> bool:
    """TASKD_TOKEN*, TASKD_TLS_* and the names above (a rank's environment is scrubbed of every one)."""
    return name in CREDENTIAL_VARS or name.startswith(("TASKD_TOKEN", "TASKD_TLS_"))


def env_int(name: str, default: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The integer in variable `name` (blank or unset: `default`); ValueError naming the variable otherwise.

    The one parser of integer variables in taskd: a rank reading its launcher's variables and the
    agent reading its TASKD_* settings both use it, so both report a bad value the same way.
    """
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float | None = None, environ: Mapping[str, str] | None = None) -> float | None:
    """Like `env_int`, for a number of seconds and the like."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def _int_env(*names: str, default: int) -> int:
    """The first of `names` that holds an integer; a bad value is warned about and skipped."""
    for name in names:
        try:
            value = env_int(name)
        except ValueError:
            # not silent: a rank that quietly became rank 0 would share rank 0's checkpoints
            log.warning("ignoring %s=%r: not an integer; check the launcher's environment", name,
                        os.environ.get(name))
            continue
        if value is not None:
            return value
    return default


class NotARankYet(RuntimeError):
    """Asked for the rank in a warm spare that runs the script before it becomes one (taskd.worker.spare)."""


def ring_agent() -> None:
    """Wake this rank's agent now: it reads its ranks' files only every few hundred ms while nothing happens,
    so a rank that has just written something the agent must act on (an in-place error, a question after a
    SIGCONT) rings. Never blocks, never raises: at worst the agent reads the file on its next look."""
    path = os.environ.get(Var.TASKD_AGENT_BELL)
    if not path:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC) as bell:
            bell.sendto(b"!", path)
    except OSError as exc:  # the agent gone, its queue full (it is awake then): nothing to do
        log.debug("cannot ring the agent's bell %s: %s", path, exc)


def in_spare() -> bool:
    """Whether this process is a warm spare running the script before it is a rank (taskd.worker.spare)."""
    return os.environ.get(Var.TASKD_SPARE) == "1"


def _rank_known(what: str) -> None:
    if in_spare():
        raise NotARankYet(f"taskd.worker.{what}() in a warm spare that is no rank yet (--warm-spare-mode script): "
                          "call it after LiveGroup() or taskd.worker.become_rank()")


def rank() -> int:
    """Global rank: ``RANK`` (torchrun, taskd) or ``RANK_ID`` (msrun); 0 otherwise."""
    _rank_known("rank")
    return _int_env(Var.RANK, Var.RANK_ID, default=0)


def local_rank() -> int:
    """Rank on this node: ``LOCAL_RANK``, or msrun's ``DEVICE_ID`` when running under msrun; 0 otherwise."""
    _rank_known("local_rank")
    if Var.LOCAL_RANK in os.environ:
        return _int_env(Var.LOCAL_RANK, default=0)
    if Var.MS_WORKER_NUM in os.environ or Var.RANK_ID in os.environ:
        return _int_env(Var.DEVICE_ID, default=0)
    return 0


def world_size() -> int:
    """Number of ranks in the job: ``WORLD_SIZE``, ``RANK_SIZE`` or ``MS_WORKER_NUM``; 1 otherwise."""
    _rank_known("world_size")
    return max(1, _int_env(Var.WORLD_SIZE, Var.RANK_SIZE, Var.MS_WORKER_NUM, default=1))


def restart_count() -> int:
    """How many times this rank was started before (``TASKD_RESTART_COUNT`` or torchrun's); 0 otherwise."""
    _rank_known("restart_count")
    return _int_env(Var.TASKD_RESTART_COUNT, Var.TORCHELASTIC_RESTART_COUNT, default=0)


def job_id() -> str | None:
    """The job's id under taskd (``TASKD_JOB_ID`` or ``MINDX_TASK_ID``), else None."""
    return os.environ.get(Var.TASKD_JOB_ID) or os.environ.get(Var.MINDX_TASK_ID) or None
