"""`MSRunPlugin`: what MindSpore's msrun hands a job to.

msrun builds it with no arguments, registers its four callbacks and calls `start()` before any
rank runs; `start()` blocks for the whole job and its `sys.exit(n)` becomes msrun's exit code.
The plugin only collects the callbacks and the configuration and runs the agent (`Supervisor`).
Without MINDX_SERVER_IP it needs an embedded controller: `controller_factory` builds one from the
configuration. The TaskD import path (`taskd.python.framework.agent.ms_mgr.msrun_plugin`) binds
taskd's own; this module does not import the controller.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from taskd.agent.config import AgentConfig
from taskd.agent.console import setup_console_logging
from taskd.agent.link.controller import LocalController
from taskd.agent.ranks.control import LauncherDetails
from taskd.agent.ranks.launcher import launcher_of
from taskd.agent.summary import JobResult
from taskd.agent.supervisor import Supervisor
from taskd.agent.watches.culprit import MS_CPU_COMM_DEFAULT, collective_timeout
from taskd.callbacks import CALLBACKS
from taskd.process.groups import reap_processes
from taskd.process.msrun import msrun_schedulers
from taskd.settings import setting

log = logging.getLogger("taskd.agent")

ControllerFactory = Callable[[AgentConfig], LocalController]


class MSRunPlugin:
    """Drop-in for TaskD's MSRunPlugin: collects the launcher's callbacks, then supervises the job."""

    def __init__(self, details: LauncherDetails | None = None,
                 controller_factory: ControllerFactory | None = None, **settings: Any) -> None:
        # A bad TASKD_* value must not raise here: msrun would log a warning and run the job itself,
        # unprotected. The plugin takes control and start() fails with exit 2 naming the setting.
        self.config: AgentConfig | None = None
        self.config_error: str | None = None
        try:
            self.config = AgentConfig.from_env(**settings)
        except ValueError as exc:
            self.config_error = str(exc)
        self.details = details
        self.controller_factory = controller_factory
        self._callbacks: dict[str, Callable[..., Any]] = {}
        self.result: JobResult | None = None

    def register_callbacks(self, operator: str, func: Callable[..., Any]) -> None:
        """Record a launcher callback; checked at start(), as TaskD does.

        An exception here would make msrun supervise the job itself, unprotected; so, as in TaskD,
        registration takes anything, a name taskd does not use is logged and ignored (a newer
        MindSpore may offer more), and start() refuses a missing, None or non-callable callback.
        """
        if operator not in CALLBACKS:
            log.warning("callback %r is not one taskd uses (%s): ignored", operator, ", ".join(CALLBACKS))
            return
        self._callbacks[operator] = func

    def run(self) -> JobResult:
        """Supervise the job to its end and return what happened (never calls sys.exit)."""
        missing = [name for name in CALLBACKS if name not in self._callbacks]
        if missing:
            raise RuntimeError(f"register_callbacks() was never called for {', '.join(missing)}: "
                               "register every launcher callback before start()")
        unusable = [f"{name} ({type(func).__name__})" for name, func in self._callbacks.items() if not callable(func)]
        if unusable:
            raise RuntimeError(f"callbacks registered but not callable: {', '.join(unusable)}: "
                               "register a function for every launcher callback before start()")
        setup_console_logging(only_if_unconfigured=True)
        if self.config is None:
            return self._refuse(self.config_error or "invalid configuration")
        if self.config.launcher == "msrun" and not self.config.log_dir:
            self.config = dataclasses.replace(self.config, log_dir=_msrun_log_dir(sys.argv))
        file_handler = _log_file_handler(self.config.log_dir) if self.config.launcher == "msrun" else None
        if self.config.launcher == "msrun":
            warn_above_collectives(self.config.heartbeat_timeout, os.environ)
        if self.config.launcher == "msrun" and "dump" in self.config.offered_strategies:
            self.config = dataclasses.replace(self.config, dump_timeout=msrun_dump_timeout(
                self.config.dump_timeout, os.environ))
            log.warning(MSRUN_DUMP_NOTE, self.config.dump_timeout)
        controller = None
        if self.config.server is None and self.controller_factory is not None:
            controller = self.controller_factory(self.config)
        try:
            supervisor = Supervisor(self.config, dict(self._callbacks), self.details, controller)
            self.result = supervisor.run()
        finally:
            if file_handler is not None:
                logging.getLogger("taskd").removeHandler(file_handler)
                file_handler.close()
        return self.result

    def _refuse(self, why: str) -> JobResult:
        """No rank was started; msrun's scheduler (started before start()) must not outlive us."""
        log.error("taskd: invalid setting: %s; no rank started", why)
        if not launcher_of(self.details).rank_files:  # msrun's: its scheduler started before start()
            reap_processes(msrun_schedulers(), 1.0)
        self.result = JobResult(succeeded=False, exit_code=2, reason=f"invalid setting: {why}")
        self.result.ended = self.result.started
        return self.result

    def start(self) -> None:
        """msrun's entry point: returns when every rank exited 0, else exits with the job's code."""
        result = self.run()
        if not result.succeeded:
            sys.exit(result.exit_code)


# Measured (MindSpore 2.10, CPU, docs/mindspore.md "The dump strategy"): a thread cannot save or even read a
# parameter while the training thread waits in a collective whose peer died; the training thread can, once that
# collective fails.
DUMP_SAVE_MARGIN = 15.0  # seconds for the survivor's save after its collective failed (measured: 4-11 ms + ~3 s)


def warn_above_collectives(timeout: float | None, environ: Mapping[str, str]) -> None:
    """A TASKD_HEARTBEAT_TIMEOUT at or above the ranks' collective timeout is never reached in a data-parallel
    job (the peers give up first): say so once, at the start, with what to do."""
    collective = collective_timeout(environ)
    if timeout is None or timeout < (collective or MS_CPU_COMM_DEFAULT):
        return
    told = f"{collective:.0f}s" if collective else \
        f"{MS_CPU_COMM_DEFAULT:.0f}s on CPU when MS_CPU_COMM_OP_TIMEOUT is unset"
    log.warning("heartbeat timeout %.0fs is not below the ranks' collective timeout (%s): a hung rank's peers give "
                "up in their collective first; taskd then names the hung rank when a peer exits. Leave "
                "TASKD_HEARTBEAT_TIMEOUT unset (derived from the step times) or set it lower", timeout, told)


def msrun_dump_timeout(configured: float, environ: Mapping[str, str]) -> float:
    """The dump's wait under msrun. A survivor saves only once its collective fails, the collective timeout
    after the fault: unless TASKD_DUMP_TIMEOUT is set, the wait covers that timeout (MS_CPU_COMM_OP_TIMEOUT,
    HCCL_EXEC_TIMEOUT; 30 s unset on CPU) plus the save, so that `dump,exit` saves with the defaults."""
    if environ.get(setting("dump_timeout").env or ""):
        return configured
    return max(configured, (collective_timeout(environ) or MS_CPU_COMM_DEFAULT) + DUMP_SAVE_MARGIN)


MSRUN_DUMP_NOTE = ("dump under MindSpore: a rank whose peer died saves only once its collective fails, "
                   "MS_CPU_COMM_OP_TIMEOUT (unset: 30) + about 3 s after the fault; keep that under "
                   "TASKD_DUMP_TIMEOUT (%gs), and wrap the step in taskd.worker.save_on_error() (TaskdCallback does)")


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


__all__ = ["CALLBACKS", "ControllerFactory", "MSRunPlugin"]
