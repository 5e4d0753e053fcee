"""The environment a rank receives: msrun's and torchrun's variables, so scripts for either run unchanged.

The names come from ``taskd.worker.env.Var``, the module that reads them inside the rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from taskd.launcher.spec import WorkerSpec
from taskd.worker.env import Var


def rank_env(
    spec: WorkerSpec,
    local_rank: int,
    restart_count: int,
    heartbeat_file: str | None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The full environment of one incarnation of ``local_rank``.

    ``base`` (default: this process's environment) and ``spec.extra_env`` come
    first; the launcher's own variables win over both, since a stale ``RANK``
    inherited from an outer launcher would be wrong.
    """
    env = dict(os.environ if base is None else base)
    env.update({str(k): str(v) for k, v in spec.extra_env.items()})
    global_rank = spec.global_rank(local_rank)
    world = str(spec.world_size)
    port = str(spec.master_port)
    env.update(
        {
            # MindSpore msrun
            Var.RANK_ID: str(global_rank),
            Var.RANK_SIZE: world,
            Var.DEVICE_ID: str(local_rank),
            Var.MS_WORKER_NUM: world,
            Var.MS_NODE_ID: str(global_rank),
            Var.MS_ROLE: "MS_WORKER",
            Var.MS_SCHED_HOST: spec.master_addr,
            Var.MS_SCHED_PORT: port,
            # torchrun
            Var.RANK: str(global_rank),
            Var.LOCAL_RANK: str(local_rank),
            Var.WORLD_SIZE: world,
            Var.LOCAL_WORLD_SIZE: str(spec.nproc_per_node),
            Var.GROUP_RANK: str(spec.node_rank),
            Var.MASTER_ADDR: spec.master_addr,
            Var.MASTER_PORT: port,
            Var.TORCHELASTIC_RESTART_COUNT: str(restart_count),
            # taskd
            Var.TASKD_RESTART_COUNT: str(restart_count),
            Var.TASKD_JOB_ID: spec.job_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if heartbeat_file:
        env[Var.TASKD_HEARTBEAT_FILE] = heartbeat_file
    else:
        env.pop(Var.TASKD_HEARTBEAT_FILE, None)
    return env
