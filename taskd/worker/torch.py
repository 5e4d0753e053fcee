"""Live recovery for PyTorch DDP: survivors keep running, a replacement gets their state in memory.

    from taskd.worker.torch import LiveGroup

    live = LiveGroup(backend="gloo")              # instead of dist.init_process_group()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = live.ddp(model)                         # DDP whose gradient buckets survive a rebuild
    live.track(model=model, optimizer=optimizer, seed=args.seed)   # what a replacement receives
    for step in live.steps(start, total_steps):
        with live.step():                         # a collective failure abandons just this step
            optimizer.zero_grad()
            loss_fn(ddp(x_of(step)), y_of(step)).backward()
            optimizer.step()
    live.close()

Under taskd with live recovery (``TASKD_CONTROL_FILE`` set) a failed collective, a
``RetryableError`` or the agent's request makes every rank abandon the step in flight (an
optimizer that has already stepped commits it), leave its group, wait for the agent to name
generation g, re-form the group on ``PrefixStore("taskd/gen<g>", store)``, and take the state of
the most advanced healthy rank over the new group. Everywhere else (torchrun, plain python)
``LiveGroup`` is ``init_process_group`` + ``DistributedDataParallel`` and errors propagate.
Installed with ``pip install taskd[torch]``.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from taskd.worker import live as live_protocol
from taskd.worker import progress
from taskd.worker.env import Var, rank, restart_count, world_size
from taskd.worker.live import STORE_PREFIX, Control, ErrorKind, LiveRank, Phase, RetryableError, classify_error
from taskd.worker.migration import count_joined
from taskd.worker.spare import become_rank
from taskd.worker.torch_buckets import DDPHandle
from taskd.worker.torch_data import LiveLoader
from taskd.worker.torch_facts import (
    backend_not_live,
    collectives_issued,
    group_device,
    stable_ddp_kwargs,
    step_seed,
)
from taskd.worker.torch_fsdp_live import FsdpLive
from taskd.worker.torch_group import (
    GroupSockets,
    LeaveWatch,
    RetiredGroups,
    collect,
    drop_frames,
    outlive_exit,
    settle_at_exit,
)
from taskd.worker.torch_hsdp_live import HsdpLive
from taskd.worker.torch_live_snapshot import LiveSnapshots, start_afresh
from taskd.worker.torch_mark import Backward, BackwardMark, CollectiveMark
from taskd.worker.torch_migrate import Migrating
from taskd.worker.torch_origin import collective, raised_by, watch_torch_collectives
from taskd.worker.torch_resize import Resize, ResizeHook
from taskd.worker.torch_retry import LiveRecoveryFailed, RetryInPlace, ShardsLost, StepVoided, exit_shards_lost
from taskd.worker.torch_state import LiveUsageError, hand_over, refuse_own_collectives, whole_copy
from taskd.worker.torch_stuck import StuckWatch, exit_stuck

log = logging.getLogger(__name__)

__all__ = ["LiveGroup", "LiveLoader", "LiveRecoveryFailed", "LiveUsageError", "RetryableError", "stable_ddp_kwargs"]


class LiveGroup(RetryInPlace, Migrating, FsdpLive, HsdpLive):
    """The default process group of a job that can rebuild it in place; see the module docstring."""

    def __init__(self, backend: str = "gloo", timeout: float = 60.0, init_timeout: float = 120.0,
                 on_resize: ResizeHook | None = None, snapshot_every: int = 0, snapshot_keep: int = 4) -> None:
        """``on_resize(rank, world_size)``: the job may go on at another size (scale-in/out, taskd.worker.torch_resize);
        it runs in every rank whose rank or world size changed, before its next step, to re-shard the data.
        ``snapshot_every`` k > 0: the tracked state is snapshotted in memory every k steps, ``snapshot_keep`` kept, and
        a restart of every rank restores from there (taskd.worker.torch_live_snapshot), not from ``load``.

        In a warm spare that runs the script (``--warm-spare-mode script``) this is where the spare waits to
        become a rank (`taskd.worker.become_rank`): what the script did before (its model built) precedes the fault."""
        self.memory = LiveSnapshots(snapshot_every, snapshot_keep)  # on at steps(), once the state is tracked
        become_rank()
        self.backend, self._device = backend, group_device(backend)  # where the state sync's table goes
        self.timeout = timedelta(seconds=timeout)
        self.protocol = LiveRank()
        self.live = self.protocol.enabled
        self.rank = rank()
        self.world_size = world_size()
        self._resize = Resize(on_resize, self.rank, self.rank, self.world_size)
        self.step_no = 0
        self.has_state = False  # a replacement has none until the first sync
        self.events: list[dict[str, Any]] = []  # one per recovery: what happened and how long it took
        self._handles: list[DDPHandle] = []
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._seed: int | None = None
        self._extra: dict[str, Any] = {}
        self._loaders: list[LiveLoader] = []
        self._sharded: str | None = None  # why no peer holds a copy of a rank's state (pure FSDP2), if so
        self._formed_at = 0  # the group's collective count once formed
        self._committed = False
        self._in_step = False
        self.forwards = 0  # DDP forwards in this step
        self.mark = CollectiveMark(self.protocol)  # "inside a collective", for the agent
        self.backward = BackwardMark(self.mark)  # how far this step's backward got (which buckets were launched)
        self._stuck = StuckWatch(self.mark, exit_stuck(self.rank))  # ends the rank if gloo leaves it blocked
        self._store: dist.TCPStore | None = None
        self._sockets = GroupSockets()  # the current generation's connections (live only)
        self._leave_watch: LeaveWatch | None = None  # ends them when the agent says the group is broken
        self._dropped: list[weakref.ref[DistributedDataParallel]] = []  # wrappers a recovery let go of
        self._retired = RetiredGroups()  # groups left, held while work of theirs may still wait (torch_group)
        settle_at_exit()  # gloo's workers free their last works (and take the GIL) before the interpreter finalizes
        self._group_timeout = self.timeout  # the longest collective timeout the current group had
        if self.live and (off := backend_not_live(backend)):
            self._form_static(off, init_timeout)
            return
        if not self.live:
            if self.rank == 0 and (why := live_protocol.why_not_live()):
                log.warning("%s", why)
            if not dist.is_initialized():
                dist.init_process_group(backend, timeout=self.timeout)
            return
        watch_torch_collectives()  # an error only a collective raised makes the ranks leave their group (torch_origin)
        self.protocol.set_phase(Phase.REJOINING)  # before declaring: a new node's agent then knows it joins a group
        self.protocol.declare(rejoin=True, retry=True, resize=self._resize.declared)
        if self.protocol.join_after is not None and not self.protocol.await_named():  # a prepared replacement
            self.protocol.set_phase(Phase.GAVE_UP)
            raise LiveRecoveryFailed(f"rank {self.rank}: a prepared replacement, but no rejoin was named in time")
        latest = self.protocol.watch.latest() if self.protocol.watch is not None else None
        if latest is not None and latest.generation == self.protocol.generation:  # started into a resized group
            self.rank, self.world_size = self._resize.place(latest, self.rank, self.world_size)
        self._sockets = GroupSockets(os.environ[Var.MASTER_ADDR], os.environ[Var.MASTER_PORT])
        self._leave_watch = LeaveWatch(self.protocol.control_path, self._sockets, on_end=self._told_to_leave).start()
        self._store = dist.TCPStore(os.environ[Var.MASTER_ADDR], int(os.environ[Var.MASTER_PORT]),
                                    is_master=False, timeout=timedelta(seconds=init_timeout))
        self._join(self.protocol.generation, init_timeout)

    def _form_static(self, why: str, init_timeout: float) -> None:
        """A group taskd cannot rebuild (NCCL): declared not rejoinable, formed once on the agent's store under a
        prefix of its own per start (the store outlives whole-job restarts; torch adds no prefix of its own)."""
        self.live = False
        self.protocol.declare(rejoin=False, retry=False)
        if self.rank == 0:
            log.warning("live recovery is off for this job: %s; a fault restarts every rank from its snapshot or "
                        "checkpoint (job-rescheduling)", why)
        store = dist.TCPStore(os.environ[Var.MASTER_ADDR], int(os.environ[Var.MASTER_PORT]), is_master=False,
                              timeout=timedelta(seconds=init_timeout))
        prefix = f"{STORE_PREFIX.format(generation=self.protocol.generation)}static/{restart_count()}/"
        dist.init_process_group(self.backend, store=dist.PrefixStore(prefix, store), rank=self.rank,
                                world_size=self.world_size, timeout=self.timeout)

    # -- what the script declares ----------------------------------------------------------------
    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> Any:
        """Wrap ``module`` in DDP whose buckets are the same in every wrapper (taskd.worker.torch_buckets); call the
        result like DDP. ``kwargs`` are DDP's."""
        handle = DDPHandle(self, module, kwargs)
        self._handles.append(handle)
        return handle

    def data(self, loader: Any, batches_per_step: int = 1) -> LiveLoader:
        """Draw the step's batches from ``loader`` with ``next()``: a redone step gets the same batches again, and
        a replacement resumes at the survivors' (epoch, batches consumed), for its own rank (torch_data)."""
        self._loaders.append(LiveLoader(loader, self.rank, lambda: self._seed, batches_per_step))
        return self._loaders[-1]

    def track(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
              seed: int | None = None, **extra: Any) -> None:
        """Declare the state a replacement receives: model, optimizer, ``extra`` objects with ``state_dict`` and
        ``load_state_dict`` (replicated across ranks). ``seed``: torch's RNG is reseeded at each step from (seed,
        rank, step), so a replacement draws the numbers the dead rank would have; per-rank state must be a function
        of the step."""
        self._model, self._optimizer, self._seed = model, optimizer, seed
        self._extra = dict(extra)
        why = self._path(model) if self.live and model is not None else None
        if why is not None and model is not None:  # pure FSDP2 with snapshots: every rank rolls back (torch_fsdp_live)
            why = self._rolls_back(model, why)
        self._sharded = why
        if why is not None:
            # no peer holds a whole copy to hand a replacement: say so now, so that the first fault takes the
            # checkpoint path at once (issue 21, D7: a recover that could not work failed after 175 s)
            self.protocol.declare(rejoin=False, retry=False)
            if self.rank == 0:
                log.warning("live recovery is off for this job: %s, so no peer holds a whole copy to hand a "
                            "replacement; a fault restarts every rank from its checkpoint (job-rescheduling)", why)
        if optimizer is not None:
            if self.live:
                optimizer.register_step_pre_hook(self._before_optimizer_step)
            optimizer.register_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, *_: Any) -> None:
        self._committed = True  # the step's update is applied: a failure after this commits it
        if self._in_step:  # and its batches are consumed: a checkpoint taken from here on holds both (issue 32, F4)
            self._data("commit")

    # -- the training loop -------------------------------------------------------------------------
    def steps(self, start: int, stop: int, load: Callable[[int], object] | None = None) -> Iterator[int]:
        """Yield step numbers from the job's current step to ``stop``; the first call is collective.

        ``start`` is where this rank could start (its newest checkpoint, or 0). If a healthy rank holds live state
        (this rank is a replacement), everyone takes that state and its step and ``load`` is not called. Otherwise
        (job start, whole-job restart) the ranks agree on the lowest ``start`` and each calls ``load(step)`` to
        restore it from its checkpoint. Between steps it honours the agent's requests; after a recovery the
        abandoned step comes again."""
        self.step_no = start
        self.memory.start([self._model, self._optimizer, *self._extra.values(), *self._loaders], self._sharded)
        self._sync_and_wrap(load)
        while self.step_no < stop:
            if self.live:
                if (control := self.protocol.requested()) is not None and self._due(control):  # one os.stat
                    self._act_on(control)  # a recovery, or a planned migration at its agreed boundary
                    continue
                self._resize.run(self.rank, self.world_size)  # the group changed size: the script re-shards
            yield self.step_no
        if self.live:
            self.protocol.set_phase(Phase.COMPLETE)

    @contextmanager
    def step(self) -> Iterator[int]:
        """One attempt at the current step; a recoverable failure inside it rolls it back (see module doc)."""
        step = self.step_no
        self._committed = False
        self.forwards = 0
        self.backward.new_step()
        self._in_step = True
        if self._seed is not None:
            torch.manual_seed(step_seed(self._seed, self.rank, step))
        try:
            yield step
        except StepVoided:
            self._in_step = False
            self._data("rollback")
            self._redo(step, None)
            return
        except Exception as exc:
            self._in_step = False
            kind = classify_error(exc, self._from_collective(exc)) if self.live else None
            if kind is None:
                if self.live:  # the step's own error: this rank exits with it and is replaced (torch_origin)
                    log.error("rank %d: step %d raised %s of the script's own (no collective raised it): the rank "
                              "exits with it and is replaced", self.rank, step, type(exc).__name__)
                raise
            self._data("commit" if self._committed else "rollback")
            if kind == ErrorKind.RETRYABLE and not self._committed and self._drain(exc):
                self._redo(step, exc)
                return
            if self._committed:
                self.step_no = step + 1
            self._recover((kind, exc), None)
            return
        finally:
            self._in_step = False
        self.mark.reset()
        self.step_no = step + 1
        self._data("commit")
        self.has_state = True
        self.memory.save(self.step_no)
        progress.heartbeat(step)

    def _from_collective(self, exc: BaseException) -> bool:
        """Whether a collective raised ``exc``: marked where it was raised, or left backward from DDP's finalize."""
        return raised_by(exc) is not None or self.backward.state is Backward.FINALIZING

    def close(self) -> None:
        """Leave the group at the end of training."""
        for handle in self._handles:
            handle.current = None
        self._data("close")
        self.memory.close()  # the publish in flight; the segments stay for the agent to remove
        if self._leave_watch is not None:
            self._leave_watch.stop()
        self._end_groups()
        self._sockets.release()
        # what follows (results, the interpreter's exit, where torch 2.13's gloo teardown aborts a rank now and then)
        # is no fault: nothing collective is left (issue 32, F2)
        progress.finished()
        kept = self._retired.keep_past_exit()  # freed at interpreter exit, a left group's leftover work held the rank
        if kept:
            log.debug("rank %d: %d group(s) left less than their timeout ago are kept past exit", self.rank, kept)

    def _end_groups(self) -> None:
        """Destroy the group for good, every group torch knows kept past the process's exit (DDP keeps them alive
        past the destroy: `outlive_exit` says why they must not be freed while the interpreter finalizes)."""
        if dist.is_initialized():
            groups = list(dist.distributed_c10d._world.pg_map)
            dist.destroy_process_group()
            outlive_exit(groups)

    def _data(self, what: str) -> None:
        for loader in self._loaders:
            getattr(loader, what)()

    def _told_to_leave(self, ended: int, control: Control) -> None:  # on the leave watch's thread
        log.info("rank %d: the agent says generation %d is over (%s %d): %d connection(s) ended", self.rank,
                 self.protocol.generation, control.action, control.generation, ended)
        self._stuck.arm()  # its collective now fails in milliseconds, or it is left blocked (torch_stuck)

    # -- recovery ----------------------------------------------------------------------------------
    def _recover(self, error: tuple[ErrorKind, BaseException] | None, control: Control | None) -> None:
        t0 = time.time()
        event: dict[str, Any] = {"from_generation": self.protocol.generation, "step": self.step_no,
                                 "error": error[0].name if error else None, "time": t0}
        if error is not None:
            log.warning("rank %d: step %d abandoned (%s): %s", self.rank, self.step_no, error[0].name,
                        str(error[1]).splitlines()[0][:200])
            self.protocol.report_error(error[0], self.step_no)
        else:
            self.protocol.set_phase(Phase.PAUSED)
        self._leave(error[1] if error else None)
        event["left_s"] = time.time() - t0
        collect()  # DDP's reducer and buckets form cycles; free them before the next wrapper is built
        event["wrappers_freed"] = not any(ref() is not None for ref in self._dropped)  # none leaks per recovery
        while True:
            if control is None:
                control = self.protocol.wait_requested()
            if control is None or control.action == "abort":
                self.protocol.set_phase(Phase.GAVE_UP)
                reason = "no new generation was named in time" if control is None else "the agent asked to abort"
                exc = error[1] if error else None
                raise LiveRecoveryFailed(f"rank {self.rank}: live recovery failed: {reason}") from exc
            event.update(generation=control.generation, action=control.action, control_s=time.time() - t0)
            self.rank, self.world_size = self._resize.place(control, self.rank, self.world_size)
            for loader in self._loaders:
                loader.rank = self.rank
            try:
                self._join(control.generation, control.timeout)
                self._sync_and_wrap(joining=control)
                break
            except Exception as exc:  # a fault during the rebuild: wait for the next generation
                kind = classify_error(exc, raised_by(exc) is not None)
                if kind is None:
                    raise
                log.warning("rank %d: forming generation %d failed: %s", self.rank, control.generation,
                            str(exc).splitlines()[0][:200])
                self.protocol.report_error(kind, self.step_no)
                self._leave(exc)
                collect()
                error, control = (kind, exc), None
        event.update(resume_step=self.step_no, total_s=time.time() - t0, rank=self.rank, world_size=self.world_size)
        self.events.append(event)
        log.info("rank %d: rejoined generation %d at step %d in %.3fs", self.rank, self.protocol.generation,
                 self.step_no, event["total_s"])

    def _leave(self, error: BaseException | None = None) -> None:
        """End our connections of the group (peers blocked on us fail at once), then drop DDP and the group.

        Freeing the group alone does not end them in time: see taskd.worker.torch_group.
        """
        t0 = time.time()
        ended = self._sockets.shut_down()  # first: it also unblocks our own gloo threads waiting on live peers
        self._dropped = [weakref.ref(h.current) for h in self._handles if h.current is not None]
        for handle in self._handles:
            handle.current = None
        if self._model is not None:
            self._model.zero_grad(set_to_none=True)
        self.mark.forget()
        drop_frames(error)
        if dist.is_initialized():
            self._retire_mesh()
            self._retired.hold(dist.distributed_c10d._get_default_group(), self._group_timeout.total_seconds())
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001 - a broken group may fail to tear down; it is gone anyway
                log.debug("destroy_process_group: %s", exc)
        log.info("rank %d: left generation %d (%d connection(s) ended) in %.3fs", self.rank,
                 self.protocol.generation, ended, time.time() - t0)

    def _join(self, generation: int, timeout: float) -> None:
        self.protocol.generation = generation
        self.protocol.set_phase(Phase.REJOINING)
        prefix = STORE_PREFIX.format(generation=generation)
        store = dist.PrefixStore(prefix, self._store)  # type: ignore[arg-type]
        store.set_timeout(timedelta(seconds=timeout))
        t0 = time.time()
        # forming the group may take the control file's timeout (peers may still be blocked in the old group's
        # collective until its timeout); the group's collectives then get the script's timeout back
        forming = max(self.timeout, timedelta(seconds=timeout))
        self._sockets.release()  # a failed earlier attempt's, already ended
        with self._sockets.forming(generation), collective("forming the group"):
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world_size,
                                    timeout=forming)
        self._group_timeout = forming  # what it was formed with bounds work posted then
        if forming != self.timeout and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
            dist.distributed_c10d._set_pg_timeout(self.timeout)
        self._reform_mesh(generation)  # HSDP: the mesh's sub-groups on the new default group
        self._formed_at = collectives_issued()  # what forming the group ran itself (TORCH_DIST_INIT_BARRIER=1)
        log.debug("rank %d: joined %s in %.3fs", self.rank, prefix, time.time() - t0)

    def _sync_and_wrap(self, load: Callable[[int], object] | None = None, joining: Control | None = None) -> None:
        """Everyone takes the state of the most advanced rank that has one, then DDP is (re)built. ``joining``: the
        request this generation was formed for (None: the one it started into, read once formed, below)."""
        if self.live and not self._sharded:  # FSDP: no replacement joins
            refuse_own_collectives(self.rank, collectives_issued() - self._formed_at)
        self.mark.enter()
        try:
            mine = torch.tensor([1 if self.has_state else 0, self.step_no], dtype=torch.int64, device=self._device)
            table = [torch.zeros(2, dtype=torch.int64, device=self._device) for _ in range(self.world_size)]
            with collective("the state sync"):
                dist.all_gather(table, mine)
            rows = [(int(t[0]), int(t[1])) for t in table]
            holders = [r for r, (has, _) in enumerate(rows) if has]
            try:
                if holders and self._fsdp:  # FSDP2: no peer holds a lost rank's shards, every rank rolls back
                    self.step_no = self._roll_back()
                elif holders:  # HSDP: each shard coordinate's from a peer replica; else the most advanced rank's
                    self._hand_over(*(self._hsdp.sources(rows) if self._hsdp is not None else whole_copy(rows)))
                else:  # nobody holds live state: the newest step every rank holds in memory, else the checkpoint
                    self.step_no = start_afresh(self.memory, self.rank, rows, self._loaders, load, self._device)
            except ShardsLost as exc:  # alike on every rank: each says no more than rank 0's line and exits
                self.memory.close()
                self._end_groups()  # a healthy group, left so that the interpreter's exit never tears it down
                exit_shards_lost(self.rank, exc, self.protocol, at_once=True)
        finally:
            self.mark.reset()
        for handle in self._handles:
            handle.build()
        self.has_state = True
        if self.live:
            self.protocol.joined(self.protocol.generation, self.step_no)
            if joining is None and self.protocol.watch is not None:  # a node migration's successor: its standby
                joining = self.protocol.watch.latest()  # wrote the move after starting it, before g could form
            count_joined(self._store, joining, self.protocol.generation)  # a node migration's leaving ranks wait

    def _hand_over(self, step: int, pairs: list[tuple[int, list[int]]]) -> None:
        self.step_no = step
        mesh = None if self._hsdp is None else self._hsdp.mesh
        for source, lacking in pairs:
            if self.rank == source or self.rank in lacking:  # the ranks that hold the same state take no part
                hand_over(source, lacking, self._model, self._optimizer, self._extra, self._loaders, mesh=mesh)
