"""The agent's half of the continue handshake: a rank continued after a stop waits for this word.

A rank that receives SIGCONT holds before its next step (`taskd.worker.continued`) and asks through its
heartbeat file. The agent asks the controller, by a HealthCheck sent after the rank asked, whether it still
holds its node: "yes" is written back as the time it asked, and the rank goes on; "fenced" (411) becomes the
agent's FENCE order, which kills the waiting ranks before they take a step (issue 31, F1: a whole node
SIGSTOPped until it was replaced, continued after its job ended, wrote checkpoints and outputs for 39 s).
An agent without a controller (standalone, degraded) cannot be fenced: it answers at once. A controller that
does not answer is asked again every `RETRY` seconds; the rank's own limit ends its wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from taskd.client.errors import FencedError
from taskd.vocabulary import Code
from taskd.worker.heartbeat_file import HeartbeatFile

log = logging.getLogger("taskd.agent")

RETRY = 0.5  # seconds between two questions while the controller does not answer


class ContinueWord:
    """Answers the ranks that ask whether they may go on after a stop (see the module's doc)."""

    def __init__(self, client: Callable[[], Any], fence: Callable[[str], None]) -> None:
        self._client = client  # the RecoverClient, None without a controller
        self._fence = fence
        self._asking: threading.Thread | None = None
        self._next = 0.0

    def watch(self, files: Iterable[HeartbeatFile | None], now: float, alone: bool = False) -> None:
        """Each turn of the agent's loop: the ranks that asked get their answer, or a question is on its way.
        `alone`: the agent runs degraded (no controller to ask, none to fence it)."""
        waiting = [f for f in files if f is not None and _asked(f) is not None]
        if not waiting or (self._asking is not None and self._asking.is_alive()) or now < self._next:
            return
        client = None if alone else self._client()
        if client is None:
            _answer(waiting, time.monotonic())
            return
        self._next = now + RETRY
        self._asking = threading.Thread(target=self._ask, args=(client, waiting), name="taskd-continue", daemon=True)
        self._asking.start()

    def _ask(self, client: Any, waiting: list[HeartbeatFile]) -> None:
        asked_at = time.monotonic()  # after every rank in `waiting` asked: the answer covers each of them
        try:
            status = client.health_check()
        except FencedError as exc:
            self._fence(str(exc))
            return
        except Exception as exc:  # unreachable, or closing: the next turn asks again
            log.debug("continue check: %s", exc)
            return
        if status.code == Code.FENCED:
            self._fence(status.info)
        elif status.code == Code.OK:
            log.info("continued after a stop: the controller still counts this agent as node's holder; ranks go on")
            _answer(waiting, asked_at)
        else:
            log.debug("continue check answered %d: %s", status.code, status.info)


def _asked(f: HeartbeatFile) -> float | None:
    try:
        return f.continue_asked()
    except (OSError, ValueError):  # the file went away with its rank
        return None


def _answer(files: list[HeartbeatFile], asked_at: float) -> None:
    for f in files:
        try:
            f.answer_continue(asked_at)
        except (OSError, ValueError):
            pass


__all__ = ["RETRY", "ContinueWord"]
