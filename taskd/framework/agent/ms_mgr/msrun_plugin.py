"""`MSRunPlugin`: what MindSpore's msrun (and `taskd run`) hands a job to.

msrun builds it with no arguments, registers its four callbacks and calls `start()` before any
rank runs; `start()` blocks for the whole job and its `sys.exit(n)` becomes msrun's exit code.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from taskd.agent.config import AgentConfig
from taskd.agent.summary import JobResult
from taskd.agent.supervisor import LauncherDetails, Supervisor

log = logging.getLogger("taskd.agent")

CALLBACKS = ("KILL_WORKER", "START_ALL_WORKER", "START_WORKER_LIST", "MONITOR")


class MSRunPlugin:
    """Drop-in for TaskD's MSRunPlugin: collects the launcher's callbacks, then supervises the job."""

    def __init__(self, details: LauncherDetails | None = None, **settings: Any) -> None:
        self.config = AgentConfig.from_env(**settings)
        self.details = details
        self._callbacks: dict[str, Callable[..., Any]] = {}
        self.result: JobResult | None = None

    def register_callbacks(self, operator: str, func: Callable[..., Any]) -> None:
        if operator not in CALLBACKS:
            raise ValueError(f"unknown callback {operator!r}; expected one of {', '.join(CALLBACKS)}")
        if not callable(func):
            raise TypeError(f"callback {operator} must be callable, not {type(func).__name__}")
        self._callbacks[operator] = func

    def run(self) -> JobResult:
        """Supervise the job to its end and return what happened (never calls sys.exit)."""
        missing = [name for name in CALLBACKS if name not in self._callbacks]
        if missing:
            raise RuntimeError(f"register_callbacks() was never called for {', '.join(missing)}")
        _ensure_console_logging()
        supervisor = Supervisor(self.config, dict(self._callbacks), self.details)
        self.result = supervisor.run()
        return self.result

    def start(self) -> None:
        """msrun's entry point: returns when every rank exited 0, else exits with the job's code."""
        result = self.run()
        log.info("%s", result.format_summary())
        if not result.succeeded:
            sys.exit(result.exit_code)


def _ensure_console_logging() -> None:
    """Under msrun nobody configured logging: give taskd's events a console line of their own."""
    root = logging.getLogger("taskd")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[taskd %(asctime)s] %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
