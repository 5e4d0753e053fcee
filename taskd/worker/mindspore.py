"""`TaskdCallback`: taskd's worker SDK as a `Model.train` callback, for MindSpore users who write callbacks.

    ckpt = ModelCheckpoint(prefix="net", directory=ckpt_dir, config=CheckpointConfig(save_checkpoint_steps=10))
    model.train(epochs, dataset, callbacks=[TaskdCallback(ckpt), LossMonitor()], dataset_sink_mode=False)

It beats once per step with the job's global step (`global_step`: `Model.train` restarts
`cur_step_num` at 0 on every launch, `initial_epoch` does not add to it), so hang detection works
without a `heartbeat()` in a loop body and "redoes N steps" counts the steps redone; the first step
(graph compile, communication warm-up) and every save of the `ModelCheckpoint` handed to it run
inside `taskd.worker.section`s with their own timeouts; a save request of the `dump` strategy is
served by writing a checkpoint into that `ModelCheckpoint`'s directory, at a step end or, when a
step raised (a dead peer's collective failed), as `Model.train` unwinds, named and stamped with the
global step (`epoch_num`, `step_num` as ModelCheckpoint's `append_info`); `rejoinable=True`
declares the ranks independent (`taskd.worker.declare_rejoinable`).
Pass the `ModelCheckpoint` to `TaskdCallback`, not also to `Model.train`: it is driven from here.

`SnapshotCallback(net, optimizer, every=k)` keeps the cells' parameters (the optimizer's state is parameters
too) in the node's memory every k steps (`taskd.worker.snapshot`): its ``restore()``, before training, loads
the newest step every rank holds and returns it, so that a rescheduled job redoes at most k steps. Once
``mindspore.communication.init()`` has run, the ranks agree on that step and vote on its copies through
MindSpore's own AllReduce (`common_steps`): msrun gives no node count, so without it a rank sees only its node.
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
from taskd.worker.progress import heartbeat, on_save_request, section, serve_after_error
from taskd.worker.snapshot import DEFAULT_EVERY, Fallback, SnapshotError, Snapshots
from taskd.worker.snapshot_ballot import SLOTS, common, holds, offer, offered

log = logging.getLogger("taskd.worker")

# Measured with MindSpore 2.10 on CPU (PyNative, MCCL, MS_ENABLE_RECOVERY=1 as msrun sets it): while the training
# thread waited in an AllReduce whose peer had been SIGKILLed, a second thread's save_checkpoint, and even its
# Parameter.asnumpy(), did not return until the AllReduce failed (RuntimeError "Launch kernel failed:
# AllReduce", MS_CPU_COMM_OP_TIMEOUT + ~3 s later: 33 s unset, 4 s with 1, 6 s with 3); the training thread
# then saved in 4-11 ms. So the save
# request is served on the training thread: at a step end, or when the step raised (``__exit__``).
DUMP_LIMIT = ("taskd: MindSpore cannot save while a collective blocks the training thread: for a dump, a rank "
              "whose peer died saves when its collective fails (MS_CPU_COMM_OP_TIMEOUT, unset 30, + about 3 s "
              "after the fault; keep that under TASKD_DUMP_TIMEOUT)")

_said_dump_limit = False


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
        self._done = 0  # steps completed (MindSpore counts a step in cur_step_num before running it)
        self.dumped: list[str] = []  # checkpoints written for save requests, newest last

    # -- Model.train's hooks -------------------------------------------------------------------

    def on_train_begin(self, run_context: Any) -> None:
        if self.rejoinable:
            declare_rejoinable()
        global _said_dump_limit
        if "dump" in os.environ.get("TASKD_STRATEGIES", "") and not _said_dump_limit:
            _said_dump_limit = True  # once per process, at the start
            log.warning(DUMP_LIMIT)
        self._params = run_context.original_args()
        self._done = global_step(self._params)
        on_save_request(self._save_now)
        self._first = section("first step", timeout=self.first_step_timeout)
        self._first.__enter__()
        if self.checkpoint is not None:
            self.checkpoint.on_train_begin(run_context)

    def on_train_step_end(self, run_context: Any) -> None:
        params = run_context.original_args()
        self._params = params
        self._done = global_step(params)
        self._end_first_step()
        if self.checkpoint is not None:
            with section("checkpoint", timeout=self.save_timeout):
                self.checkpoint.on_train_step_end(run_context)
        heartbeat(self._done)  # serves a pending save request, at a step boundary

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
        heartbeat(global_step(run_context.original_args()))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Model.train left its callbacks' context: when a step raised (a collective failed because a peer
        died), serve the dump's save request now, on the training thread, with the last completed step's
        state; the exception goes on."""
        if exc_type is not None and issubclass(exc_type, Exception):
            serve_after_error(error=exc)

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
        step = self._done
        os.makedirs(directory, exist_ok=True)
        # not "<prefix>-...": ModelCheckpoint's keep_checkpoint_max rotation would count (and delete) it
        path = os.path.join(directory, f"taskd-dump-{self._prefix()}-step{step}.ckpt")
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-taskd-dump-step{step}.ckpt")  # MindSpore adds .ckpt
        started = time.monotonic()
        # epoch_num/step_num as ModelCheckpoint's append_info writes them (step_num here: the global step)
        stamp = {"step": step, "epoch_num": _param(params, "cur_epoch_num"), "step_num": step}
        ms.save_checkpoint(params.train_network, tmp, append_dict=stamp)
        os.replace(tmp, path)
        self.dumped.append(path)
        # on the rank's stderr (msrun's console shows warnings): the operator needs the path to resume from it
        log.warning("taskd: dump saved %s (global step %d, epoch %d) in %.2fs", path, step, stamp["epoch_num"],
                    time.monotonic() - started)
        return True

    def _directory(self) -> str:
        directory = getattr(self.checkpoint, "_directory", None) if self.checkpoint is not None else None
        return directory or os.path.join(os.getcwd(), f"taskd-dump-rank{_rank_id()}")

    def _prefix(self) -> str:
        return str(getattr(self.checkpoint, "_prefix", None) or "taskd") if self.checkpoint is not None else "taskd"


class SnapshotCallback(Callback):
    """In-memory snapshots of ``cells``' parameters (network and optimizer: moments, step, learning rate are
    parameters) every ``every`` global steps, as a `Model.train` callback or through ``save`` in a loop of one's
    own; ``restore()`` before training loads the newest consistent step. ``keep``, ``fallback`` and the options
    as `taskd.worker.Snapshots`."""

    def __init__(self, *cells: Any, every: int = DEFAULT_EVERY, keep: int = 2, fallback: Fallback | None = None,
                 **options: Any) -> None:
        super().__init__()
        if not cells or not all(callable(getattr(c, "parameters_and_names", None)) for c in cells):
            raise TypeError("SnapshotCallback needs the cells to snapshot (network, optimizer): MindSpore Cells")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"SnapshotCallback: every must be a positive number of steps, not {every!r}")
        if isinstance(keep, int) and keep >= SLOTS:  # Snapshots checks the rest; the vote's rows hold SLOTS steps
            raise ValueError(f"SnapshotCallback: keep must be below {SLOTS}, not {keep}")
        self.cells, self.every = cells, every
        self.snapshots = Snapshots(keep=keep, scope="job", fallback=fallback, **{"agree": common_steps, **options})

    @property
    def restored_from(self) -> str | None:
        return self.snapshots.restored_from

    def _parameters(self) -> dict[str, Any]:
        return {param.name: param for cell in self.cells for _, param in cell.parameters_and_names()}

    def save(self, step: int) -> bool:
        """Snapshot every parameter of the cells as ``step`` (a copy each; published in the background)."""
        return self.snapshots.save({name: p.asnumpy() for name, p in self._parameters().items()}, step)

    def restore(self) -> int:
        """Load the newest step every rank holds (else the fallback's) into the cells; that step, 0 if none."""
        agreed = self.snapshots.agree is not None and communicating()  # a cut across all of msrun's nodes
        found = self.snapshots.restore(use=self._load_into, agreed=agreed)
        return 0 if found is None else found[1]

    def _load_into(self, saved: dict[str, Any]) -> None:
        params = self._parameters()
        if set(saved) != set(params):
            raise SnapshotError(f"the snapshot's parameters are not the cells': missing "
                                f"{sorted(set(params) - set(saved))}, unknown {sorted(set(saved) - set(params))}")
        for name, param in params.items():
            param.set_data(ms.Tensor(saved[name].copy()))  # its own memory: the snapshot's is the segment's

    def on_train_step_end(self, run_context: Any) -> None:
        step = global_step(run_context.original_args())
        if step % self.every == 0:
            self.save(step)

    def on_train_end(self, run_context: Any) -> None:
        self.snapshots.close()


def communicating() -> bool:
    """Whether ``mindspore.communication.init()`` has run in a job of several ranks (a collective can agree)."""
    from mindspore.communication import GlobalComm, get_group_size

    return bool(GlobalComm.INITED) and get_group_size() > 1


def common_steps(steps: set[int]) -> set[int]:
    """The values every rank of the job holds, from each rank's own (`Snapshots`'s ``agree``): two AllReduces of
    MindSpore's world group (on CPU it sums float32 only), of 2 KB and 512 bytes whatever the world size: rank 0's
    set (`offer`), then how many ranks hold each of its values (`holds`; taskd.worker.snapshot_ballot). A
    collective every rank calls; SnapshotError before ``mindspore.communication.init()``."""
    if not communicating():
        raise SnapshotError("mindspore.communication.init() has not run: nothing agrees on a step across the ranks")
    from mindspore import Tensor, ops
    from mindspore.communication import get_group_size, get_rank

    candidates = offered(ops.AllReduce()(Tensor(offer(steps, get_rank()))).asnumpy())
    counts = ops.AllReduce()(Tensor(holds(candidates, steps))).asnumpy()
    return common(candidates, counts, get_group_size())


def global_step(params: Any) -> int:
    """The job's step count across launches, from `Model.train`'s callback parameters.

    `cur_step_num` restarts at each launch (a resumed `Model.train(initial_epoch=k)` counts from 0, or from
    MindSpore's own repair step), while `cur_epoch_num` is the global epoch (1-based) and `batch_num` the
    steps of one epoch (of one sink in sink mode): their product plus the step within the epoch is global.
    Before the first epoch begins (no `cur_epoch_num` yet) it is `cur_step_num`."""
    step, epoch, per_epoch = (_param(params, name) for name in ("cur_step_num", "cur_epoch_num", "batch_num"))
    if step <= 0 or epoch <= 0 or per_epoch <= 0:
        return step
    return (epoch - 1) * per_epoch + (step - 1) % per_epoch + 1


def _param(params: Any, name: str) -> int:
    """One of `Model.train`'s callback parameters, 0 when not set yet (they raise KeyError, not AttributeError)."""
    try:
        return int(getattr(params, name) or 0)
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def _rank_id() -> str:
    return os.environ.get("RANK_ID", "0")


__all__ = ["SnapshotCallback", "TaskdCallback", "common_steps", "communicating", "global_step"]
