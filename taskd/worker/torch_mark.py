"""The "inside a collective" mark a LiveGroup rank keeps in its heartbeat file.

A rank waiting on its peers is not hung, and that wait is not its own compute time (the straggler
comparison): the agent reads the mark for both. DDP's buckets complete on gloo's thread, so the count of
collectives in flight is kept under a lock and only its 0 <-> >0 edges are written.

A collective that fails leaves the mark on: ``report_error`` clears it together with the error. Cleared
at once, the agent would see a rank that is neither in a collective nor reporting, which is what a hang
looks like (CI, session 13: a peer whose collective had just failed was taken for a second hang).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

from taskd.worker.live import LiveRank


class CollectiveMark:
    """Collectives in flight, written to the heartbeat file when the count leaves or reaches zero."""

    def __init__(self, protocol: LiveRank) -> None:
        self._protocol = protocol
        self._lock = threading.Lock()
        self._in_flight = 0

    def enter(self) -> None:
        self._move(+1)

    def leave(self) -> None:
        self._move(-1)

    def reset(self) -> None:
        """No collective is in flight any more (the step ended, or was voided on every rank)."""
        with self._lock:
            if self._in_flight:
                self._in_flight = 0
                self._protocol.collective(False)

    def forget(self) -> None:
        """The group is gone and the mark was cleared with the error it reported: count from zero again."""
        with self._lock:
            self._in_flight = 0

    def _move(self, delta: int) -> None:
        with self._lock:
            before = self._in_flight
            self._in_flight = max(0, before + delta)
            if (before == 0) != (self._in_flight == 0):
                self._protocol.collective(self._in_flight > 0)


def marked_allreduce(group, bucket):  # noqa: ANN001, ANN201 - DDP rejects string annotations in a comm hook
    """DDP's allreduce, the rank marked inside a collective while a bucket is in flight. ``group`` is the
    LiveGroup: it counts the buckets launched in a step (a drain makes only the rest)."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    group._launched += 1
    group.mark.enter()
    return unmark_when_done(group.mark, dist.all_reduce(tensor, async_op=True).get_future())


def unmark_when_done(mark: CollectiveMark, fut: torch.futures.Future[Any]) -> torch.futures.Future[Any]:
    """Lift the mark when the collective completes, not when it fails (see the module doc)."""

    def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        value = f.value()[0]
        mark.leave()
        return value

    return fut.then(done)
