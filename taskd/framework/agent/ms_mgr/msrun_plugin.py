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
            raise RuntimeError(f"register_callbacks() was never called for {', '.join(missing)}: "
                               "register every launcher callback before start()")
        _ensure_console_logging()
        if self.config.launcher == "msrun" and not self.config.log_dir:
            self.config.log_dir = _msrun_log_dir(sys.argv)
        file_handler = _log_file_handler(self.config.log_dir) if self.config.launcher == "msrun" else None
        try:
            supervisor = Supervisor(self.config, dict(self._callbacks), self.details)
            self.result = supervisor.run()
            log.info("%s", self.result.format_summary())
        finally:
            if file_handler is not None:
                logging.getLogger("taskd").removeHandler(file_handler)
                file_handler.close()
        return self.result

    def start(self) -> None:
        """msrun's entry point: returns when every rank exited 0, else exits with the job's code."""
        result = self.run()
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


def _msrun_log_dir(argv: list[str]) -> str | None:
    """The plugin runs inside msrun: its --log_dir is in our own argv."""
    for i, arg in enumerate(argv):
        if arg == "--log_dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--log_dir="):
            return arg.split("=", 1)[1]
    return None


def _log_file_handler(log_dir: str | None) -> logging.Handler | None:
    """taskd's events next to msrun's scheduler.log and worker_<rank>.log."""
    if not log_dir:
        return None
    import os

    try:
        os.makedirs(log_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(log_dir, "taskd_agent.log"), encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write taskd's log in %s: %s", log_dir, exc)
        return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("taskd")
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    return handler
