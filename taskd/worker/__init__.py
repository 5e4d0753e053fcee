"""What a training script imports from taskd: rank info, atomic checkpoints, heartbeats.

    from taskd import worker

    ckpt = worker.CheckpointManager(f"ckpt/rank{worker.rank()}", keep=3)
    state, start = ckpt.load_latest() or (init_state(), 0)
    worker.on_save_request(lambda: ckpt.save(state, step))
    for step in range(start, steps):
        state = train_step(state, step)
        worker.heartbeat(step)
        if step % 100 == 0:
            with worker.section("checkpoint", timeout=600):
                ckpt.save(state, step)
    worker.finished()    # optional: the rest (results, framework shutdown) is not a hang

Standard library only; every call is harmless outside taskd.
"""

from taskd.worker.checkpoint import CheckpointManager, CorruptCheckpoint
from taskd.worker.env import job_id, local_rank, rank, restart_count, world_size
from taskd.worker.heartbeat_file import HeartbeatFile, HeartbeatFileError, HeartbeatState
from taskd.worker.live import RetryableError, declare_rejoinable, preimport
from taskd.worker.progress import (
    collective,
    finished,
    heartbeat,
    on_save_request,
    save_on_error,
    section,
    serve_save_request,
)
from taskd.worker.serializers import Serializer, register_serializer
from taskd.worker.snapshot import Snapshots
from taskd.worker.snapshot_segment import SnapshotError
from taskd.worker.spare import become_rank

__all__ = [
    "CheckpointManager",
    "CorruptCheckpoint",
    "HeartbeatFile",
    "HeartbeatFileError",
    "HeartbeatState",
    "RetryableError",
    "Serializer",
    "SnapshotError",
    "Snapshots",
    "become_rank",
    "heartbeat",
    "collective",
    "declare_rejoinable",
    "finished",
    "job_id",
    "local_rank",
    "on_save_request",
    "preimport",
    "rank",
    "register_serializer",
    "restart_count",
    "save_on_error",
    "section",
    "serve_save_request",
    "world_size",
]
