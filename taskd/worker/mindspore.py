"""`TaskdCallback`: taskd's worker SDK as a `Model.train` callback, for MindSpore users who write callbacks.

    ckpt = ModelCheckpoint(prefix="net", directory=ckpt_dir, config=CheckpointConfig(save_checkpoint_steps=10))
    model.train(epochs, dataset, callbacks=[TaskdCallback(ckpt), LossMonitor()], dataset_sink_mode=False)

It beats once per step (`cb_params.cur_step_num`), so `TASKD_HEARTBEAT_TIMEOUT` works without a
`heartbeat()` in a loop body; the first step (graph compile, communication warm-up) and every save of
the `ModelCheckpoint` handed to it run inside `taskd.worker.section`s with their own timeouts; a
save request of the `dump` strategy is served by writing a checkpoint into that `ModelCheckpoint`'s
directory; `rejoinable=True` declares the ranks independent (`taskd.worker.declare_rejoinable`).
Pass the `ModelCheckpoint` to `TaskdCallback`, not also to `Model.train`: it is driven from here.
With dataset sink mode, MindSpore calls step callbacks once per sink: the heartbeat then comes per
sink, so the heartbeat timeout must be longer than one sink.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import AbstractContextManager
from typing import Any

import mindspore as ms
from mindspore.train import Callback

from taskd.worker.live import declare_rejoinable
from taskd.worker.progress import heartbeat, on_save_request, section

log = logging.getLogger("taskd.worker")

# Measured with MindSpore 2.10 on CPU (PyNative, MCCL): a save_checkpoint from a second thread, started while
# the training thread waited in an AllReduce whose peer had died, did not return until the AllReduce failed
# 30 s later and MindSpore killed the process. So the save request is served on the training thread only.
DUMP_LIMIT = ("taskd: a dump's save request is served at the next step end, on the training thread: MindSpore "
              "cannot save while a collective blocks it, so a rank whose peer died saves nothing")


class TaskdCallback(Callback):
    """Heartbeats, sections and the dump's save request for `Model.train` (module docstring)."""

    def __init__(self, checkpoint: Callback | None = None, *, rejoinable: bool = False,
                 first_step_timeout: float = 600.0, save_timeout: float = 600.0) -> None:
        super().__init__()
        for name, value in (("first_step_timeout", first_step_timeout), ("save_timeout", save_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"TaskdCallback: {name} must be a positive number of seconds, not {value!r}")
        if checkpoint is not None and not hasattr(checkpoint, "on_train_step_end"):
            raise TypeError(f"TaskdCallback: checkpoint must be a ModelCheckpoint (a Callback), not "
                            f"{type(checkpoint).__name__}")
        self.checkpoint = checkpoint
        self.rejoinable = bool(rejoinable)
        self.first_step_timeout = float(first_step_timeout)
        self.save_timeout = float(save_timeout)
        self._first: AbstractContextManager[None] | None = None
        self._params: Any = None
        self.dumped: list[str] = []  # checkpoints written for save requests, newest last

    # -- Model.train's hooks -------------------------------------------------------------------

    def on_train_begin(self, run_context: Any) -> None:
        if self.rejoinable:
            declare_rejoinable()
        if "dump" in os.environ.get("TASKD_STRATEGIES", ""):
            log.warning(DUMP_LIMIT)
        self._params = run_context.original_args()
        on_save_request(self._save_now)
        self._first = section("first step", timeout=self.first_step_timeout)
        self._first.__enter__()
        if self.checkpoint is not None:
            self.checkpoint.on_train_begin(run_context)

    def on_train_step_end(self, run_context: Any) -> None:
        params = run_context.original_args()
        self._params = params
        self._end_first_step()
        if self.checkpoint is not None:
            with section("checkpoint", timeout=self.save_timeout):
                self.checkpoint.on_train_step_end(run_context)
        heartbeat(int(params.cur_step_num))  # serves a pending save request, at a step boundary

    def on_train_epoch_end(self, run_context: Any) -> None:
        if self.checkpoint is not None:
            with section("checkpoint", timeout=self.save_timeout):
                self.checkpoint.on_train_epoch_end(run_context)

    def on_train_end(self, run_context: Any) -> None:
        self._end_first_step()
        if self.checkpoint is not None:
            with section("checkpoint", timeout=self.save_timeout):
                self.checkpoint.on_train_end(run_context)
        on_save_request(None)
        heartbeat(int(run_context.original_args().cur_step_num))

    # -- the dump's save request ----------------------------------------------------------------

    def _end_first_step(self) -> None:
        if self._first is not None:
            first, self._first = self._first, None
            first.__exit__(None, None, None)

    def _save_now(self) -> bool:
        """Write the network (and optimizer) state now, atomically, where the ModelCheckpoint writes its own."""
        params = self._params
        if params is None:
            return False
        directory = self._directory()
        step = int(getattr(params, "cur_step_num", 0))
        os.makedirs(directory, exist_ok=True)
        # not "<prefix>-...": ModelCheckpoint's keep_checkpoint_max rotation would count (and delete) it
        path = os.path.join(directory, f"taskd-dump-{self._prefix()}-step{step}.ckpt")
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-taskd-dump-step{step}.ckpt")  # MindSpore adds .ckpt
        started = time.monotonic()
        ms.save_checkpoint(params.train_network, tmp, append_dict={"step": step})
        os.replace(tmp, path)
        self.dumped.append(path)
        log.info("taskd: saved %s for a save request in %.2fs", path, time.monotonic() - started)
        return True

    def _directory(self) -> str:
        directory = getattr(self.checkpoint, "_directory", None) if self.checkpoint is not None else None
        return directory or os.path.join(os.getcwd(), f"taskd-dump-rank{_rank_id()}")

    def _prefix(self) -> str:
        return str(getattr(self.checkpoint, "_prefix", None) or "taskd") if self.checkpoint is not None else "taskd"


def _rank_id() -> str:
    return os.environ.get("RANK_ID", "0")


__all__ = ["TaskdCallback"]
