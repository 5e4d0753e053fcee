"""The environment a rank receives: msrun's and torchrun's variables, so scripts for either run unchanged,
and none of the controller's credentials (TASKD_TOKEN_FILE, TASKD_TLS_*): they are the agent's.

The names come from ``taskd.worker.env.Var``, the module that reads them inside the rank. The
torchrun variables have the names and meanings torch's LocalElasticAgent gives them
(torch/distributed/elastic/agent/server/local_elastic_agent.py, ``_start_workers``), for a job
with one role: ROLE_RANK is the global rank and ROLE_WORLD_SIZE the world size.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from taskd.launcher.spec import WorkerSpec
from taskd.worker.env import Var, is_credential_var

# torchrun's own words (torch/distributed/run.py), logged once by the launcher when it sets the default.
OMP_WARNING = (
    "*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be "
    "%s in default, to avoid your system being overloaded, "
    "please further tune the variable for optimal performance in "
    "your application as needed. \n"
    "*****************************************"
)
OMP_DEFAULT = 1


def omp_default(spec: WorkerSpec, base: Mapping[str, str] | None = None) -> bool:
    """Whether ranks get OMP_NUM_THREADS=1: as torchrun, when several run per node and the user set none."""
    env = os.environ if base is None else base
    return spec.nproc_per_node > 1 and Var.OMP_NUM_THREADS not in env and Var.OMP_NUM_THREADS not in spec.extra_env


def rank_env(
    spec: WorkerSpec,
    local_rank: int,
    restart_count: int,
    heartbeat_file: str | None,
    base: Mapping[str, str] | None = None,
    *,
    job_restart_count: int | None = None,
    error_file: str | None = None,
) -> dict[str, str]:
    """The full environment of one incarnation of ``local_rank``.

    ``base`` (default: this process's environment) and ``spec.extra_env`` come
    first; the launcher's own variables win over both, since a stale ``RANK``
    inherited from an outer launcher would be wrong.

    ``restart_count`` is this rank's own count (TASKD_RESTART_COUNT); ``job_restart_count``
    the job-wide one torch scripts expect in TORCHELASTIC_RESTART_COUNT (default: the rank's).
    ``error_file`` becomes TORCHELASTIC_ERROR_FILE, where torch's ``@record`` writes.
    """
    source = os.environ if base is None else base
    env = dict(source)
    env.update({str(k): str(v) for k, v in spec.extra_env.items()})
    # the controller's credentials are the agent's: a training script (or any of its dependencies) that could
    # read them could fail or finish any job the credential reaches (RELIABILITY.md, "Ranks")
    for name in [k for k in env if is_credential_var(k)]:
        del env[name]
    global_rank = str(spec.global_rank(local_rank))
    world = str(spec.world_size)
    port = str(spec.master_port)
    job_restarts = restart_count if job_restart_count is None else job_restart_count
    if omp_default(spec, source):
        env[Var.OMP_NUM_THREADS] = str(OMP_DEFAULT)
    env.setdefault(Var.TORCH_NCCL_ASYNC_ERROR_HANDLING, "1")  # torchrun's default
    env.update(
        {
            # MindSpore msrun
            Var.RANK_ID: global_rank,
            Var.RANK_SIZE: world,
            Var.DEVICE_ID: str(local_rank),
            Var.MS_WORKER_NUM: world,
            Var.MS_NODE_ID: global_rank,
            Var.MS_ROLE: "MS_WORKER",
            Var.MS_SCHED_HOST: spec.master_addr,
            Var.MS_SCHED_PORT: port,
            # torchrun
            Var.RANK: global_rank,
            Var.LOCAL_RANK: str(local_rank),
            Var.WORLD_SIZE: world,
            Var.LOCAL_WORLD_SIZE: str(spec.nproc_per_node),
            Var.GROUP_RANK: str(spec.node_rank),
            Var.GROUP_WORLD_SIZE: str(spec.nnodes),
            Var.ROLE_NAME: spec.role,
            Var.ROLE_RANK: global_rank,
            Var.ROLE_WORLD_SIZE: world,
            Var.MASTER_ADDR: spec.master_addr,
            Var.MASTER_PORT: port,
            Var.TORCHELASTIC_RESTART_COUNT: str(job_restarts),
            Var.TORCHELASTIC_MAX_RESTARTS: str(spec.max_restarts),
            Var.TORCHELASTIC_RUN_ID: spec.job_id,
            # taskd
            Var.TASKD_RESTART_COUNT: str(restart_count),
            Var.TASKD_JOB_ID: spec.job_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    for name, value in ((Var.TASKD_HEARTBEAT_FILE, heartbeat_file), (Var.TORCHELASTIC_ERROR_FILE, error_file)):
        if value:
            env[name] = value
        else:
            env.pop(name, None)  # an outer launcher's file is not this rank's
    return env


RANK_VARIABLES = frozenset({
    Var.RANK_ID, Var.RANK_SIZE, Var.DEVICE_ID, Var.MS_WORKER_NUM, Var.MS_NODE_ID, Var.MS_ROLE, Var.MS_SCHED_HOST,
    Var.MS_SCHED_PORT, Var.RANK, Var.LOCAL_RANK, Var.WORLD_SIZE, Var.LOCAL_WORLD_SIZE, Var.GROUP_RANK,
    Var.GROUP_WORLD_SIZE, Var.ROLE_RANK, Var.ROLE_WORLD_SIZE, Var.MASTER_ADDR, Var.MASTER_PORT,
    Var.TORCHELASTIC_RESTART_COUNT, Var.TORCHELASTIC_ERROR_FILE, Var.TORCHELASTIC_USE_AGENT_STORE,
    Var.TASKD_RESTART_COUNT, Var.TASKD_HEARTBEAT_FILE, Var.TASKD_HEARTBEAT_DIR, Var.TASKD_CONTROL_FILE,
    Var.TASKD_GENERATION, Var.TASKD_JOIN_AFTER,
})
"""What tells a rank who and where it is: a warm spare that runs the script before it is a rank has none of them."""


def spare_env(spec: WorkerSpec, script: bool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a warm spare starts with (a standby's too, which has no node yet). ``script`` False: a
    placeholder rank's, replaced by the rank's own when the spare becomes one. ``script`` True: a spare that runs
    the script before it is a rank gets what every rank shares (the user's variables, OMP_NUM_THREADS, ...) and
    none of `RANK_VARIABLES` (an outer launcher's included), so nothing the script does before
    `taskd.worker.become_rank()` can take a rank's identity by mistake."""
    shared = spec if spec.node_rank is not None else dataclasses.replace(spec, node_rank=0)
    env = rank_env(shared, 0, 0, None, base)
    if script:
        for name in RANK_VARIABLES:
            env.pop(name, None)
    return env
