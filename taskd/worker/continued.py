"""A rank continued after a stop (SIGCONT) takes no further step until its agent says the node is still its own.

A whole node SIGSTOPped past the controller's loss grace is declared lost, fenced and replaced. When it is
continued, its agent learns that it was fenced and kills its ranks, but the ranks were continued at the same
instant: without a hold they would train on and write checkpoints and outputs meanwhile, even after the job
ended (issue 31, F1). So a rank with a heartbeat file handles SIGCONT by holding its main thread (and its
background checkpoint writes) until its agent answers through the heartbeat file's continue handshake
(`taskd.worker.heartbeat_file`, bytes 248-255): the agent asks the controller after the rank asked; "still
the holder" lets the rank go on, "fenced" kills it where it waits. Python runs the handler in the main thread
at the next bytecode, so at most the system call the rank was stopped in completes first.

A rank whose agent gives no answer within `HOLD_MAX` goes on and says so (an agent that cannot reach its
controller for that long cannot tell either). A script with a SIGCONT handler of its own keeps it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from taskd.worker import heartbeat_file as hbf
from taskd.worker.env import ring_agent

log = logging.getLogger(__name__)

HOLD_MAX = 60.0
"""Seconds a continued rank waits for its agent's word at most (twice TASKD_CONTROLLER_TIMEOUT's default)."""
POLL = 0.01  # seconds between two looks at the answer


def wait_for_word(buf: Any, continued_at: float, hold: Callable[[float], None],
                  limit: float = HOLD_MAX, clock: Callable[[], float] = time.monotonic) -> bool:
    """Ask the agent (the handshake's -T) and wait until its answer is at least `continued_at`; False when
    `limit` seconds passed without it. `hold(seconds)` pauses the background checkpoint writes meanwhile."""
    deadline = clock() + limit
    while True:
        value = hbf.CONTINUE.unpack_from(buf, hbf.OFF_CONTINUE)[0]
        if value >= continued_at:
            return True
        if value >= 0:  # nothing asked yet, or an answer to an earlier stop: ask for this one
            hbf.CONTINUE.pack_into(buf, hbf.OFF_CONTINUE, -continued_at)
            ring_agent()
        if clock() >= deadline:
            return False
        hold(1.0)
        time.sleep(POLL)


_watched: list[Any] = []  # the heartbeat buffer the handler answers through (the newest attached)


def install(buf: Any) -> bool:
    """Hold this rank after each SIGCONT until its agent's word (see the module's doc). False, nothing installed,
    outside the main thread or where the script handles SIGCONT itself."""
    if threading.current_thread() is not threading.main_thread():
        return False
    from taskd.worker.checkpoint import hold_background_saves  # not in the handler: no import inside a signal

    def on_continued(_signum: int, _frame: object) -> None:
        continued_at = time.monotonic()
        hold_background_saves(1.0)
        if _watched and not wait_for_word(_watched[0], continued_at, hold_background_saves):
            log.warning("continued after a stop, and no word from the taskd agent within %.0fs: going on", HOLD_MAX)

    try:
        current = signal.getsignal(signal.SIGCONT)
        if current not in (signal.SIG_DFL, None) and getattr(current, "__module__", "") != __name__:
            return False
        _watched[:] = [buf]
        signal.signal(signal.SIGCONT, on_continued)
    except (ValueError, OSError) as exc:  # not the main interpreter
        log.debug("no hold after SIGCONT: %s", exc)
        return False
    return True


def forget() -> None:
    """A forked child (a data loader worker) answers to no agent: SIGCONT continues it as by default."""
    if _watched:
        _watched.clear()
        try:
            signal.signal(signal.SIGCONT, signal.SIG_DFL)
        except (ValueError, OSError):  # forked from another thread than the main one: the handler finds no buffer
            pass


__all__ = ["HOLD_MAX", "forget", "install", "wait_for_word"]
