"""The "inside a collective" mark a LiveGroup rank keeps in its heartbeat file.

A rank waiting on its peers is not hung, and that wait is not its own compute time (the straggler
comparison): the agent reads the mark for both. Only its 0 <-> >0 edges are written.

Where the mark is set: DDP's gradient allreduces run on gloo's threads while backward computes, and the rank
waits for them at the end of backward (the reducer's finalize). So the mark goes on when backward reaches the
wrapper's output and off when backward has ended (`BackwardMark`): one tensor hook and two autograd-engine
callbacks per step. It used to be a Python comm hook around every bucket's allreduce, and that hook cost ~7 % of
a step at 4 ranks (BENCHMARKS.md, "LiveGroup's steady-state cost"); DDP now runs its own C++ allreduce. The
trade-off: the backward's own compute counts as waiting, so a rank that hangs inside backward is not told apart
from its waiting peers by the marks (its stacks still tell, taskd.agent.watches.culprit), and a straggler's backward
compute is not counted against it.

A collective that fails leaves the mark on: ``report_error`` clears it together with the error. Cleared
at once, the agent would see a rank that is neither in a collective nor reporting, which is what a hang
looks like (CI, session 13: a peer whose collective had just failed was taken for a second hang).
"""

from __future__ import annotations

import enum
import threading
from typing import Any

import torch
from torch.autograd import Variable
from torch.nn.parallel.distributed import _find_tensors

from taskd.worker.live import LiveRank


class CollectiveMark:
    """Collectives in flight, written to the heartbeat file when the count leaves or reaches zero."""

    def __init__(self, protocol: LiveRank) -> None:
        self._protocol = protocol
        self._lock = threading.Lock()
        self._in_flight = 0
        self.epoch = 0  # counts the clearings (step ended, group left): a watcher sees the rank moved on

    @property
    def in_flight(self) -> bool:
        return self._in_flight > 0

    def enter(self) -> None:
        self._move(+1)

    def leave(self) -> None:
        self._move(-1)

    def reset(self) -> None:
        """No collective is in flight any more (the step ended, or was voided on every rank)."""
        with self._lock:
            self.epoch += 1
            if self._in_flight:
                self._in_flight = 0
                self._protocol.collective(False)

    def forget(self) -> None:
        """The group is gone and the mark was cleared with the error it reported: count from zero again."""
        with self._lock:
            self.epoch += 1
            self._in_flight = 0

    def _move(self, delta: int) -> None:
        with self._lock:
            before = self._in_flight
            self._in_flight = max(0, before + delta)
            if (before == 0) != (self._in_flight == 0):
                self._protocol.collective(self._in_flight > 0)


class Backward(enum.Enum):
    """How far this step's synchronised backward got: what a retry's drain must still make (LiveGroup._drain)."""

    NOT_STARTED = "not started"  # no gradient bucket launched yet
    RUNNING = "running"  # some launched, which ones is not known
    FINALIZING = "finalizing"  # the graph has run (every bucket launched); DDP's finalize waits for them
    DONE = "done"  # every bucket launched and completed


class BackwardMark:
    """Marks the rank inside a collective from the moment backward reaches DDP's output until backward has ended."""

    def __init__(self, mark: CollectiveMark) -> None:
        self.mark = mark
        self.state = Backward.NOT_STARTED

    def new_step(self) -> None:
        self.state = Backward.NOT_STARTED

    def attach(self, output: Any) -> None:
        """Hook the tensors of a synchronised forward's ``output`` that backward will reach (found as DDP finds the
        ones it prepares its backward for: nested lists, tuples, dicts, dataclasses)."""
        for tensor in _find_tensors(output):
            if tensor.requires_grad:
                tensor.register_hook(self._reached)

    def _reached(self, _grad: torch.Tensor) -> None:
        if self.state in (Backward.RUNNING, Backward.FINALIZING):  # another output tensor of the same backward
            return
        self.state = Backward.RUNNING
        self.mark.enter()
        # queued now it would run before DDP's finalize (queued when the last bucket is ready), which waits for
        # every bucket; queued from a callback it runs after it
        Variable._execution_engine.queue_callback(self._queue_end)

    def _queue_end(self) -> None:
        # the first final callback (queued before DDP's finalize): final callbacks run only once the graph has run
        # without error, so an error raised from here on is DDP's finalize's, its allreduce's (torch_origin)
        self.state = Backward.FINALIZING
        Variable._execution_engine.queue_callback(self._ended)

    def _ended(self) -> None:  # not reached when DDP's finalize raised: the mark stays on (module doc)
        self.state = Backward.DONE
        self.mark.leave()

