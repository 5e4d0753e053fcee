"""Signal -> handlers: an explicit table from action names and signal types to callables.

For each signal the handler of its signal type runs first, then the handler of each action in the
signal's order (each once). A handler that raises is logged and the others still run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from taskd.client import arguments
from taskd.client.signals import RecoverSignal, parse_signal
from taskd.proto import recover_pb2
from taskd.vocabulary import SignalType

logger = logging.getLogger(__name__)

SignalHandler = Callable[[RecoverSignal], Any]


class Dispatcher:
    """The handler table of one client; `register` from any thread, `prepare` on the stream's thread."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._lock = threading.Lock()
        self._handlers: dict[str, SignalHandler] = {}  # replaced, never mutated: readers need no lock

    def register(self, name: str, fn: SignalHandler | None) -> None:
        """Handle an action (`stop_train`, ...) or a signal type (`killMaster`, ...); None removes."""
        name, fn = arguments.handler(name, fn)
        with self._lock:
            handlers = dict(self._handlers)
            if fn is None:
                handlers.pop(name, None)
            else:
                handlers[name] = fn
            self._handlers = handlers

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def prepare(self, message: recover_pb2.ProcessManageSignal) -> Callable[[], None] | None:
        """What to run for `message`, or None when nothing is (a bare keep-alive, another job's signal).

        Cheap for the common case (a keep-alive every few seconds), so the stream's loop only hands
        work to a thread when a handler must run.
        """
        handlers = self._handlers
        if message.jobId and message.jobId != self.job_id:
            logger.warning("dropping %s signal %s for job %r: this agent serves job %r",
                           message.signalType, message.uuid, message.jobId, self.job_id)
            return None
        keep_alive = message.signalType == SignalType.KEEP_ALIVE
        if keep_alive and SignalType.KEEP_ALIVE not in handlers and not message.actions:
            return None
        signal = parse_signal(message)
        if not keep_alive:
            logger.info("signal %s %s actions=%s fault_ranks=%s strategy=%r", signal.uuid, signal.signal_type,
                        signal.actions, signal.fault_ranks, signal.strategy)
        plan: list[tuple[str, SignalHandler]] = []
        type_handler = handlers.get(signal.signal_type)
        if type_handler is not None:
            plan.append((signal.signal_type, type_handler))
        elif not keep_alive and not signal.actions:
            logger.warning("no handler for signal type %r (signal %s) and no actions", signal.signal_type, signal.uuid)
        for action in dict.fromkeys(signal.actions):
            handler = handlers.get(action)
            if handler is None:
                logger.warning("no handler registered for action %r (signal %s); ignored", action, signal.uuid)
            else:
                plan.append((action, handler))
        if not plan:
            return None
        return lambda: run_handlers(plan, signal)


def run_handlers(plan: list[tuple[str, SignalHandler]], signal: RecoverSignal) -> None:
    for name, fn in plan:
        try:
            fn(signal)
        except Exception:
            logger.exception("handler for %r failed on signal %s; the stream goes on", name, signal.uuid)
