"""In-memory snapshots of a PyTorch Lightning job: a callback in, a checkpoint path out (the `[lightning]` extra).

    from taskd.worker.lightning_snapshot import SnapshotCallback

    snapshots = SnapshotCallback()                              # a snapshot every 10 steps (every=k: any k)
    trainer = L.Trainer(max_steps=1000, callbacks=[snapshots])
    trainer.fit(model, data, ckpt_path=snapshots.resume(trainer))   # None: nothing to restore, a fresh start

After each k-th optimizer step the callback snapshots what a Lightning checkpoint holds (the trainer's
``dump_checkpoint``: weights, optimizer and scheduler states, the loops' progress, callbacks' and the data
module's state), as Lightning's own ``ModelCheckpoint(every_n_train_steps=k)`` would, but into the node's
memory (`taskd.worker.Snapshots`: one memory copy, no disk). ``resume(trainer)`` restores the newest step every
rank holds (from memory, else the agent's persisted copies) as a ``.ckpt`` file on disk, where the trainer keeps its
own checkpoints (``<default_root_dir>/taskd-resume/rank<R>/step=<step>.ckpt``, or under ``dirpath``), for
``fit(ckpt_path=...)``, which Lightning restores as it restores its own. Never in the job's snapshot directory:
that is tmpfs, where a second copy of the whole state would take host memory outside the snapshots' cap. The file
is removed once training starts (Lightning has restored it by then), at the end of training, on an exception, in
``close()``, and (one left by a rank killed before any of these) at this rank's next ``resume``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import lightning.pytorch as pl
import torch

from taskd.worker import resume_dir
from taskd.worker.env import rank
from taskd.worker.snapshot import DEFAULT_EVERY, Snapshots
from taskd.worker.torch_snapshot import common_steps

log = logging.getLogger(__name__)

class SnapshotCallback(pl.Callback):
    """Snapshots the trainer's checkpoint every ``every`` optimizer steps; ``resume(trainer)`` gives the path to fit
    from. ``keep``, ``fallback`` and the other options as `taskd.worker.Snapshots` (scope "job")."""

    def __init__(self, every: int = DEFAULT_EVERY, keep: int = 2, **options: Any) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.snapshots = Snapshots(keep=keep, scope="job", **{"agree": common_steps, **options})
        self._saved = -1  # the step of the last snapshot (global_step stays put over accumulated batches)
        self._resume_dir: str | None = None  # this rank's folder of the file resume() wrote, until it is removed

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_resume_dir()  # restored by now (Lightning restores before training starts)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_resume_dir()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._drop_resume_dir()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every or step == self._saved:
            return
        self.snapshots.save(trainer._checkpoint_connector.dump_checkpoint(weights_only=False), step)
        self._saved = step

    def resume(self, trainer: pl.Trainer | None = None, *, dirpath: str | None = None) -> str | None:
        """The newest consistent snapshot as a checkpoint file (for ``fit(ckpt_path=...)``), None when there is
        none. The file goes under ``dirpath``, else the ``trainer``'s ``default_root_dir``, else the current
        directory (Lightning's own default for it), in ``taskd-resume/rank<R>/``; ValueError before anything is
        restored when that folder is remote, or when it is the default and in memory (tmpfs). A job on several
        nodes agrees on the step through torch.distributed: initialise it first."""
        folder = self._resume_dir = self._resume_root(trainer, dirpath)
        self._drop_resume_dir()  # one a killed incarnation of this rank left
        found = self.snapshots.restore()
        if found is None:
            return None
        checkpoint, step = found
        os.makedirs(folder, mode=0o700)
        self._resume_dir = folder
        path = os.path.join(folder, f"step={step}.ckpt")
        torch.save(checkpoint, path)
        log.info("rank %d resumes the Lightning trainer at step %d from %s (%s)", rank(), step,
                 self.snapshots.restored_from, path)
        return path

    @staticmethod
    def _resume_root(trainer: pl.Trainer | None, dirpath: str | None) -> str:
        """This rank's resume folder, checked (see `resume`)."""
        base = dirpath if dirpath is not None else trainer.default_root_dir if trainer is not None else os.getcwd()
        if "://" in str(base):
            raise ValueError(f"resume(): {base!r} is not a local folder; pass resume(trainer, dirpath=...) a local "
                             "one for the checkpoint file Lightning resumes from")
        kind = resume_dir.memory_filesystem(base)
        if kind is not None and dirpath is None and trainer is None:
            raise ValueError(f"resume(): the current directory {base} is in memory ({kind}), where the checkpoint "
                             "file would be a second copy of the state outside the snapshots' cap: call "
                             "resume(trainer) (its default_root_dir) or resume(dirpath=...) with a folder on disk")
        if kind is not None:
            log.warning("the Lightning resume file goes to %s, in memory (%s): a second copy of the state outside "
                        "the snapshots' cap until training starts", base, kind)
        return resume_dir.rank_folder(base, rank())

    def _drop_resume_dir(self) -> None:
        if self._resume_dir is None:
            return
        resume_dir.drop(self._resume_dir)
        self._resume_dir = None

    def close(self) -> None:
        self._drop_resume_dir()
        self.snapshots.close()


__all__ = ["SnapshotCallback"]
