"""A planned migration's successor on the launcher (docs/worker.md, "Planned migration"): a warm spare bound to a
rank that still runs, and adopted as its next incarnation once it has joined the rank's group."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from taskd.launcher.node_files import remove_old
from taskd.worker.env import Var
from taskd.worker.heartbeat_file import HeartbeatFile

log = logging.getLogger("taskd.launcher")


class Successors:
    """Methods of `LocalLauncher` (taskd.launcher.local, which names them), kept here: they use its lock, rank table,
    spares and `_start`."""

    _lock: threading.RLock
    _closed: bool
    _standby: bool
    _restart_rounds: int
    _job_restarts: int | None
    _table: Any
    _spares: Any
    _live: Any
    spec: Any

    def prepare_successor(self, local_rank: int, after_generation: int) -> tuple[str, int] | None:
        """A warm spare becomes ``local_rank``'s successor while the rank still runs (a planned migration,
        docs/worker.md): it runs the script into `LiveGroup()` and waits there for a generation above
        ``after_generation``, writing a heartbeat file of its own until `adopt_successor`: (its path, the successor's
        pid); None when no spare is ready (or no live job, or the rank is not running)."""
        with self._lock:
            current = self._table.current(local_rank) if self._table.valid(local_rank) else None
            out, err = self.spec.console_streams(local_rank) if current is not None else (None, None)
            if self._closed or not self._live.enabled or self._standby or current is None or not current.running \
                    or out != err or not self._spares.ready():
                return None
            job_restarts = self._restart_rounds if self._job_restarts is None else self._job_restarts
            path = self.heartbeat_path(local_rank) + ".next"
            env = {**self._env(local_rank, job_restarts), Var.TASKD_JOIN_AFTER: str(after_generation),
                   Var.TASKD_HEARTBEAT_FILE: path}
            HeartbeatFile(path).create()
            if not self._spares.bind(local_rank, self.spec.entrypoint, env, self.spec.cwd):
                remove_old(path)
                return None
            pid = self._spares.bound_pid(local_rank)
        log.info("migration: rank %d's successor started from a warm spare", self.spec.global_rank(local_rank))
        return path, pid or 0

    def adopt_successor(self, local_rank: int) -> int | None:
        """The prepared successor becomes ``local_rank``'s current incarnation (its heartbeat file moved to the
        rank's path); the predecessor stays tracked until it exits. Its pid, or None when it is gone."""
        with self._lock:
            path = self.heartbeat_path(local_rank)
            if self._closed or not os.path.exists(path + ".next"):
                return None
            os.replace(path + ".next", path)
            started = self._start(local_rank)
            self._spares.refill_later()  # the spare it was is replaced, after the migration's pause
            if not started:
                return None
            current = self._table.current(local_rank)
            return current.pid if current is not None else None

    def discard_successor(self, local_rank: int) -> None:
        """A migration called off: its successor is killed and reaped, its heartbeat file removed."""
        with self._lock:
            self._spares.discard()
            self._spares.refill_later()  # the spare it was is replaced
            remove_old(self.heartbeat_path(local_rank) + ".next")


__all__ = ["Successors"]
