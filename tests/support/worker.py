"""The worker side's shared test pieces: the launcher's variables, a heartbeat file's counter, a rank's spec."""

from __future__ import annotations

from taskd.launcher.spec import WorkerSpec
from taskd.worker import heartbeat_file as hbf

# What a launcher sets in a rank's environment: a test's own rank starts without any of them.
LAUNCHER_VARS = ("RANK", "RANK_ID", "LOCAL_RANK", "DEVICE_ID", "MS_WORKER_NUM", "WORLD_SIZE", "RANK_SIZE",
                 "TASKD_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TASKD_HEARTBEAT_FILE", "TASKD_HEARTBEAT_DIR",
                 "TASKD_JOB_ID", "MINDX_TASK_ID")


def seq_of(path) -> int:  # noqa: ANN001 (a str or a Path)
    """The sequence counter of the heartbeat file at `path` (odd while a write is under way)."""
    with open(path, "rb") as fh:
        return hbf.SEQ.unpack_from(fh.read(hbf.SIZE), hbf.OFF_SEQ)[0]


def rank_env_spec() -> WorkerSpec:
    """Two nodes of three ranks, this one node 1: local rank 2 is global rank 5."""
    return WorkerSpec(entrypoint=["true"], nproc_per_node=3, nnodes=2, node_rank=1, master_port=29500, job_id="job-e")
