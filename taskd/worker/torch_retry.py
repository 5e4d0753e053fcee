"""LiveGroup's retry in place (taskd.worker.torch): a step a rank abandons (RetryableError) is voided on every
rank before any optimizer commits it, and redone in the same group, by the same processes; only when that cannot
be done exactly (or the controller chose recover) does the group re-form."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.live import SHARDS_LOST_EXIT, ErrorKind, Phase
from taskd.worker.torch_mark import Backward
from taskd.worker.torch_origin import collective
from taskd.worker.torch_stuck import exit_at_once

log = logging.getLogger(__name__)


class LiveRecoveryFailed(RuntimeError):
    """The agent named no new generation in time, or asked to abort: the rank exits so the job restarts."""


class ShardsLost(LiveRecoveryFailed):
    """Some shards are held by no live rank (HSDP: every replica of a coordinate lost) and by no snapshot every rank
    can restore (FSDP2: neither the node's segments nor the buddy's copy of the step): every rank of the new group
    finds it alike, and exits with `SHARDS_LOST_EXIT` (`exit_shards_lost`)."""


def exit_shards_lost(rank: int, exc: ShardsLost, protocol: Any, at_once: bool = False) -> None:
    """End this rank cleanly, no traceback: GAVE_UP for the agent, and the refusal said once, by rank 0 (every rank
    reached the same verdict from the same all-gathered table); SystemExit(`SHARDS_LOST_EXIT`).

    ``at_once``: `os._exit` once the logs are flushed, no interpreter finalization. A rank that has just joined
    (and left) a gloo group can abort in it ("terminate called without an active exception", SIGABRT: 2 runs in 6
    of tests/e2e/worker/test_live_fsdp.py's refusal with groups kept past exit), which the agent would take for a
    fault; the job restarts every rank anyway, so nothing the finalization would run is owed."""
    protocol.set_phase(Phase.GAVE_UP)
    log.log(logging.ERROR if rank == 0 else logging.INFO, "live recovery refused: %s; every rank exits (code %d) "
            "and the job restarts from its checkpoints (job-rescheduling)", exc, SHARDS_LOST_EXIT)
    if at_once:
        exit_at_once(SHARDS_LOST_EXIT)
    raise SystemExit(SHARDS_LOST_EXIT)


class StepVoided(RuntimeError):
    """A rank abandoned this step (RetryableError): every rank drops it together, before the optimizer step."""


class RetryInPlace:
    """Mixed into `LiveGroup`: it uses the group's protocol, marks, DDP handles, model and step."""

    live: bool
    rank: int
    step_no: int
    protocol: Any
    mark: Any
    backward: Any
    events: list[dict[str, Any]]
    _handles: list[Any]
    _model: torch.nn.Module | None
    _optimizer: torch.optim.Optimizer | None
    _in_step: bool
    forwards: int

    def _before_optimizer_step(self, *_: Any) -> None:
        """The step's vote: every rank says whether its step is intact before any rank commits it."""
        if self._in_step and not self._vote(ok=True):
            raise StepVoided(f"step {self.step_no} was abandoned by a rank (RetryableError): redone in place")

    def _vote(self, ok: bool) -> bool:
        """One-element allreduce of "not ok" before the optimizer step; True when every rank's step is intact."""
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
        self.mark.enter()
        with collective("the step's vote"):
            dist.all_reduce(flag)  # a failed one leaves the mark on until report_error clears it with the error
        self.mark.leave()
        return int(flag[0]) == 0

    def _drain(self, error: BaseException) -> bool:
        """Make, with zeros, the collectives the peers wait on in this step, then vote "not ok"; False when
        that cannot be done exactly (the slower rebuild then follows). The peers' collectives until the vote are
        DDP's: forward-time bucket rebuild and buffer broadcast, then one allreduce per gradient bucket in bucket
        order (as DDP's own Join does for a joined rank, ``_match_all_reduce_for_bwd_pass``)."""
        if not self._voting or len(self._handles) != 1 or self._handles[0].current is None:
            return False
        ddp = self._handles[0].current
        reducer = ddp.reducer
        if ddp.find_unused_parameters or getattr(ddp, "static_graph", False) \
                or not hasattr(reducer, "_get_zeros_like_grad_buckets") or not hasattr(reducer, "_reset_state"):
            return False
        if self.backward.state in (Backward.RUNNING, Backward.FINALIZING):  # inside backward: which buckets went out?
            return False
        t0 = time.time()
        try:
            if not self.forwards:  # the peers' forward rebuilds buckets (after the first backward), syncs buffers
                if torch.is_grad_enabled() and reducer._rebuild_buckets():
                    ddp._has_rebuilt_buckets = True
                if ddp._check_sync_bufs_pre_fwd():
                    ddp._sync_buffers()
            buckets = reducer._get_zeros_like_grad_buckets()
            owed = [] if self.backward.state is Backward.DONE else buckets  # DDP launches them all, in bucket order
            for bucket in owed:
                reducer._run_comm_hook(bucket).wait()
            self._vote(ok=False)
        except Exception as exc:  # a peer is gone too: the rebuild path takes over with this error
            log.warning("rank %d: draining step %d failed: %s", self.rank, self.step_no, str(exc).splitlines()[0])
            return False
        log.info("rank %d: step %d abandoned (RetryableError: %s); %d collective(s) drained in %.3fs", self.rank,
                 self.step_no, str(error).splitlines()[0][:200], len(owed) + 1, time.time() - t0)
        return True

    @property
    def _voting(self) -> bool:
        return self.live and self._optimizer is not None

    def _redo(self, step: int, error: BaseException | None) -> None:
        """Every rank drops the voided step (no optimizer update happened), waits for the agent's word, redoes it.

        ``retry``: same group, same processes. ``rejoin`` (the controller chose recover): the group is
        rebuilt first. ``abort`` or no word in time: LiveRecoveryFailed."""
        t0 = time.time()
        for handle in self._handles:  # the raising rank's reducer is mid-iteration; every rank resets alike
            if handle.current is not None:
                handle.current.reducer._reset_state()
        if self._model is not None:
            self._model.zero_grad(set_to_none=True)
        self.step_no = step
        self.mark.reset()
        if error is not None:
            self.protocol.report_error(ErrorKind.RETRYABLE, step)
        else:
            self.protocol.set_phase(Phase.PAUSED)
        control = self.protocol.wait_requested()
        if control is not None and control.action == "rejoin":
            self._recover(None, control)  # type: ignore[attr-defined]
            return
        if control is None or control.action != "retry":
            self.protocol.set_phase(Phase.GAVE_UP)
            reason = "no new generation was named in time" if control is None else "the agent asked to abort"
            raise LiveRecoveryFailed(f"rank {self.rank}: retry of step {step} failed: {reason}") from error
        event = {"from_generation": self.protocol.generation, "step": step, "time": t0,
                 "error": ErrorKind.RETRYABLE.name if error is not None else "VOIDED", "generation": control.generation,
                 "action": "retry", "in_place": True, "resume_step": step, "total_s": time.time() - t0}
        self.protocol.joined(control.generation, step)
        self.events.append(event)
        log.info("rank %d: retrying step %d in place (generation %d) after %.3fs", self.rank, step,
                 control.generation, event["total_s"])


__all__ = ["SHARDS_LOST_EXIT", "LiveRecoveryFailed", "RetryInPlace", "ShardsLost", "StepVoided", "exit_shards_lost"]
