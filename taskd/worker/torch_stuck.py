"""A rank left blocked in a collective of a group whose connections it ended exits rather than wait for the timeout.

Once the leave watch has ended the broken group's connections (taskd.worker.torch_group), every collective of that
group fails within milliseconds: its reads see EOF. Except one: when gloo's TCP pair (torch 2.13) sees its
connection fail it wakes the operations still queued on it, but not the receive whose message it was reading at
that moment. That receive is woken only by the collective timeout, and the rank stays in its collective that long
(60 s in the example, often 30 minutes in real jobs) while every other rank waits for it to rejoin: at 8 ranks,
1 kill of 10 in one run and 0 of 15 in the next, and 1 of 3 in an earlier one (BENCHMARKS.md, "A survivor left
blocked in its broken group"). Nothing in torch wakes that wait (``ProcessGroupGloo.abort()`` does not), so the
rank ends itself with `STUCK_EXIT`, and its agent starts it again into the group being re-formed, as a replacement
(agent/round/handlers.py `on_fault_rebuilding`): its state is its peers'.

"Blocked" is told apart from "still computing" by the process's CPU time: a backward that is still computing
(the rank's mark is on during all of backward, torch_mark) uses CPU, on the training thread or, for a GPU, on
autograd's device thread launching kernels; a process whose threads all wait uses next to none. Anything else
busy in the process (a pin-memory thread) only makes the rank wait for the timeout as before: the safe side.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from taskd.worker.live import STUCK_EXIT

log = logging.getLogger(__name__)

STUCK_AFTER = 5.0
"""Seconds a rank may stay inside a collective, its process using no CPU, after the group's connections were ended."""
_IDLE_SHARE = 0.1  # under this share of one CPU over a poll, the process is waiting, not computing


class Mark(Protocol):
    """What the watch reads of the rank's collective mark (torch_mark.CollectiveMark)."""

    in_flight: bool  # inside a collective
    epoch: int  # changes whenever the mark is cleared (the step ended, the rank left its group)


class StuckWatch:
    """Armed when the group's connections are ended; calls ``on_stuck`` if the rank stays inside that collective
    while ``cpu()`` (the process's CPU seconds) does not move for ``after`` seconds.

    ``clock`` and ``sleep`` are the watcher's time (monotonic seconds, and a wait of that many): injectable, so
    that a test plays minutes of a rank's life in microseconds instead of sleeping through them.
    """

    def __init__(self, mark: Mark, on_stuck: Callable[[float], None], cpu: Callable[[], float] = time.process_time,
                 after: float | None = None, poll: float = 0.25, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        after = STUCK_AFTER if after is None else after  # read now: a test may set the module's value first
        if after <= 0 or poll <= 0:
            raise ValueError(f"after and poll must be positive, got {after!r} and {poll!r}")
        self._mark = mark
        self._on_stuck = on_stuck
        self._cpu = cpu
        self._after = after
        self._poll = poll
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._armed: tuple[int, threading.Thread] | None = None  # the epoch watched, and its watcher

    def arm(self) -> None:
        """Watch the collective the rank is in now (called on the leave watch's thread); a second word for the
        same collective changes nothing."""
        with self._lock:
            epoch = self._mark.epoch
            if self._armed is not None and self._armed[0] == epoch and self._armed[1].is_alive():
                return
            watcher = threading.Thread(target=self._watch, args=(epoch,), name="taskd-stuck-watch", daemon=True)
            self._armed = (epoch, watcher)
            watcher.start()

    @property
    def watching(self) -> bool:
        """Whether a watcher is running (it ends when it fires or the rank leaves the collective it watches)."""
        with self._lock:
            return self._armed is not None and self._armed[1].is_alive()

    def _watch(self, epoch: int) -> None:
        started = idle_since = self._clock()
        last = self._cpu()
        while True:
            self._sleep(self._poll)
            if self._mark.epoch != epoch or not self._mark.in_flight:
                return  # out of the broken group's collective: its next one fails at once
            now, used = self._clock(), self._cpu()
            if used - last > _IDLE_SHARE * self._poll:
                idle_since = now  # computing: not blocked
            last = used
            if now - idle_since >= self._after:
                self._on_stuck(now - started)
                return


def exit_stuck(rank: int) -> Callable[[float], None]:
    """What a stuck rank does: say why on its log, then exit with `STUCK_EXIT` (no cleanup: its main thread is
    blocked in C++, and the group it would wait for is gone)."""

    def end(seconds: float) -> None:
        log.error("rank %d: still blocked in a collective %.1fs after its broken group's connections were ended "
                  "(gloo does not wake a receive whose message was arriving when the connection failed): exiting "
                  "with %d so that the agent's recovery goes on without waiting for the collective timeout",
                  rank, seconds, STUCK_EXIT)
        exit_at_once(STUCK_EXIT)

    return end


def exit_at_once(code: int) -> None:
    """Flush what the rank said (its log handlers, stdout, stderr), then `os._exit(code)`: no interpreter
    finalization, for a rank whose cleanup would block (a thread in C++) or abort (gloo torn down mid-work)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
