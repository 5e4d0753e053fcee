"""The environment a rank receives: msrun's and torchrun's variables, so scripts for either run unchanged."""

from __future__ import annotations

import os
from collections.abc import Mapping

from taskd.launcher.spec import WorkerSpec


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
            "RANK_ID": str(global_rank),
            "RANK_SIZE": world,
            "DEVICE_ID": str(local_rank),
            "MS_WORKER_NUM": world,
            "MS_NODE_ID": str(global_rank),
            "MS_ROLE": "MS_WORKER",
            "MS_SCHED_HOST": spec.master_addr,
            "MS_SCHED_PORT": port,
            # torchrun
            "RANK": str(global_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
            "GROUP_RANK": str(spec.node_rank),
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": port,
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            # taskd
            "TASKD_RESTART_COUNT": str(restart_count),
            "TASKD_JOB_ID": spec.job_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if heartbeat_file:
        env["TASKD_HEARTBEAT_FILE"] = heartbeat_file
    else:
        env.pop("TASKD_HEARTBEAT_FILE", None)
    return env
