"""In-memory snapshots of a PyTorch Lightning job: a callback in, a checkpoint path out (the `[lightning]` extra).

    from taskd.worker.lightning_snapshot import SnapshotCallback

    snapshots = SnapshotCallback()                              # a snapshot every 10 steps (every=k: any k)
    trainer = L.Trainer(max_steps=1000, callbacks=[snapshots])
    trainer.fit(model, data, ckpt_path=snapshots.resume())      # None: nothing to restore, a fresh start

After each k-th optimizer step the callback snapshots what a Lightning checkpoint holds (the trainer's
``dump_checkpoint``: weights, optimizer and scheduler states, the loops' progress, callbacks' and the data
module's state), as Lightning's own ``ModelCheckpoint(every_n_train_steps=k)`` would, but into the node's
memory (`taskd.worker.Snapshots`: one memory copy, no disk). ``resume()`` restores the newest step every rank
holds (from memory, else the agent's persisted copies) as a checkpoint file in the job's snapshot directory
(tmpfs) for ``fit(ckpt_path=...)``, which Lightning restores as it restores its own; the file is removed once
training starts.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import lightning.pytorch as pl
import torch

from taskd.worker.checkpoint import unlink_if_present
from taskd.worker.env import rank
from taskd.worker.snapshot import DEFAULT_EVERY, Snapshots
from taskd.worker.torch_snapshot import common_steps, resume_folder

log = logging.getLogger(__name__)


class SnapshotCallback(pl.Callback):
    """Snapshots the trainer's checkpoint every ``every`` optimizer steps; ``resume()`` gives the path to fit
    from. ``keep``, ``fallback`` and the other options as `taskd.worker.Snapshots` (scope "job")."""

    def __init__(self, every: int = DEFAULT_EVERY, keep: int = 2, **options: Any) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.snapshots = Snapshots(keep=keep, scope="job", **{"agree": common_steps, **options})
        self._saved = -1  # the step of the last snapshot (global_step stays put over accumulated batches)
        self._resume_file: str | None = None

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resume_file is not None:  # restored by now (Lightning restores before training starts)
            unlink_if_present(self._resume_file)
            self._resume_file = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every or step == self._saved:
            return
        self.snapshots.save(trainer._checkpoint_connector.dump_checkpoint(weights_only=False), step)
        self._saved = step

    def resume(self) -> str | None:
        """The newest consistent snapshot as a checkpoint file (for ``fit(ckpt_path=...)``), None when there is
        none. A job on several nodes agrees on the step through torch.distributed: initialise it first."""
        found = self.snapshots.restore()
        if found is None:
            return None
        checkpoint, step = found
        fd, path = tempfile.mkstemp(prefix=f"rank{rank()}-step{step}-", suffix=".ckpt", dir=resume_folder())
        with os.fdopen(fd, "wb") as fh:
            torch.save(checkpoint, fh)
        self._resume_file = path
        log.info("rank %d resumes the Lightning trainer at step %d from %s", rank(), step,
                 self.snapshots.restored_from)
        return path

    def close(self) -> None:
        self.snapshots.close()


__all__ = ["SnapshotCallback"]
