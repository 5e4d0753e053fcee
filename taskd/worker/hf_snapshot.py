"""In-memory snapshots of a Hugging Face `Trainer` job: a callback in, a resume path out (the `[hf]` extra).

    from taskd.worker.hf_snapshot import SnapshotCallback

    snapshots = SnapshotCallback()                         # a snapshot every 10 steps (every=k: any k)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[snapshots])
    trainer.train(resume_from_checkpoint=snapshots.resume())   # None: nothing to restore, a fresh start

After each k-th optimizer step the callback snapshots what a Trainer checkpoint holds (the model's and the
optimizer's state dicts, the LR scheduler's, the `TrainerState`, the RNG states) into the node's memory
(`taskd.worker.Snapshots`, one memory copy, no disk). ``resume()`` restores the newest step every rank holds
(from memory, else the agent's persisted copies) and lays it out as a Trainer checkpoint folder on disk, in the
Trainer's ``output_dir`` (``taskd-resume/rank<R>/``), so that the Trainer's own resume restores it exactly: weights,
optimizer, scheduler, RNG, and the data loader fast-forwarded past the batches already trained on. Not in the job's
snapshot directory: that is tmpfs, where a second copy of the whole state would take host memory outside the
snapshots' cap. The folder is removed once the first step after it has run, at the end of training, and (one left
by a rank killed before either) at this rank's next ``resume``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import tempfile
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from taskd.worker import resume_dir
from taskd.worker.env import rank, world_size
from taskd.worker.snapshot import DEFAULT_EVERY, Snapshots
from taskd.worker.torch_snapshot import common_steps

log = logging.getLogger(__name__)

# the Trainer's checkpoint file names (transformers.trainer's constants, stable across 4.x and 5.x)
WEIGHTS, OPTIMIZER, SCHEDULER, STATE = "pytorch_model.bin", "optimizer.pt", "scheduler.pt", "trainer_state.json"


class SnapshotCallback(TrainerCallback):
    """Snapshots the Trainer's state every ``every`` optimizer steps; ``resume()`` gives the folder to resume
    from. ``keep``, ``fallback`` and the other options as `taskd.worker.Snapshots` (scope "job": every rank
    resumes the same step)."""

    def __init__(self, every: int = DEFAULT_EVERY, keep: int = 2, **options: Any) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.snapshots = Snapshots(keep=keep, scope="job", **{"agree": common_steps, **options})
        self._objects: tuple[Any, Any, Any] | None = None
        self._resume_dir: str | None = None
        self._output_dir: str | None = None  # the Trainer's, told at its construction (on_init_end)

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._output_dir = args.output_dir

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._drop_resume_dir()

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        self._objects = (model, optimizer, lr_scheduler)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._drop_resume_dir()  # the Trainer has read it all (the RNG states last, at its first epoch)
        if self._objects is None or state.global_step % self.every:
            return
        model, optimizer, scheduler = self._objects
        self.snapshots.save({
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "trainer_state": dataclasses.asdict(state),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
        }, state.global_step)

    def resume(self) -> str | None:
        """The newest consistent snapshot as a Trainer checkpoint folder (for ``resume_from_checkpoint``), None
        when there is none. Call it after the Trainer is built (a job on several nodes agrees on the step
        through torch.distributed, which `TrainingArguments` initialises)."""
        found = self.snapshots.restore()
        if found is None:
            return None
        saved, step = found
        self._resume_dir = self._resume_root()
        shutil.rmtree(self._resume_dir, ignore_errors=True)  # one a killed incarnation of this rank left
        folder = os.path.join(self._resume_dir, f"checkpoint-{step}")
        os.makedirs(folder, mode=0o700)
        torch.save(saved["model"], os.path.join(folder, WEIGHTS))
        if saved["optimizer"] is not None:
            torch.save(saved["optimizer"], os.path.join(folder, OPTIMIZER))
        if saved["scheduler"] is not None:
            torch.save(saved["scheduler"], os.path.join(folder, SCHEDULER))
        with open(os.path.join(folder, STATE), "w") as fh:
            json.dump(saved["trainer_state"], fh)
        rng = f"rng_state_{rank()}.pth" if world_size() > 1 else "rng_state.pth"  # the Trainer's names for them
        torch.save(saved["rng"], os.path.join(folder, rng))
        log.info("rank %d resumes the Trainer at step %d from %s", rank(), step, self.snapshots.restored_from)
        return folder

    def _resume_root(self) -> str:
        """This rank's resume folder: on disk under the Trainer's output_dir (else the system's temporary one)."""
        base = self._output_dir or os.path.join(tempfile.gettempdir(), f"taskd-{os.getuid()}")
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
