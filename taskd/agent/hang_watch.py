"""Hangs: each rank's heartbeat file (`taskd.worker.heartbeat()`), judged on the slow sweep, and the
hung rank's Python stacks put in its log before it is killed (py-spy when installed, else faulthandler).

Under taskd's launcher every rank is told its own heartbeat file; under msrun no callback takes
per-rank variables, so the agent exports one directory (TASKD_HEARTBEAT_DIR) that ranks inherit and
name their file in.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from taskd.agent.ranks import Rank
from taskd.worker.env import Var
from taskd.worker.heartbeat_file import HeartbeatFile, HeartbeatFileError, HeartbeatState

log = logging.getLogger("taskd.agent")


@dataclass(frozen=True)
class Hang:
    """A rank that made no progress for longer than allowed."""

    quiet: float  # seconds since its last sign of progress
    step: int | None
    section: str
    stack_signal: int  # what the rank installed faulthandler on (0: none)

    def describe(self) -> str:
        step = f" at step {self.step}" if self.step is not None else ""
        where = f" in section {self.section!r}" if self.section else ""
        return f"last heartbeat {self.quiet:.1f}s ago{step}{where}"


class HangWatch:
    """The heartbeat files of one node's ranks: read on the sweep, reset for each new incarnation."""

    def __init__(self, details: Any, timeout: float | None, worker_log: Callable[[Rank], str | None]) -> None:
        self.details = details  # taskd's launcher names each rank's file; msrun (None) does not
        self.timeout = timeout
        self._worker_log = worker_log
        self._files: dict[int, HeartbeatFile] = {}
        self._dir: str | None = None

    def export_dir(self) -> None:
        """Under msrun, give the ranks (through our environment) a directory to write their heartbeat files in."""
        if self.details is not None or os.environ.get(Var.TASKD_HEARTBEAT_DIR):
            self._dir = os.environ.get(Var.TASKD_HEARTBEAT_DIR) if self.details is None else None
            return
        self._dir = tempfile.mkdtemp(prefix="taskd-heartbeat-")
        os.environ[Var.TASKD_HEARTBEAT_DIR] = self._dir

    def reset(self, ranks: Iterable[Rank]) -> None:
        """A fresh incarnation must not inherit its predecessor's last heartbeat (our launcher does this itself)."""
        if self._dir is None:
            return
        for rank in ranks:
            try:
                HeartbeatFile(os.path.join(self._dir, f"rank_{rank.global_rank}.hb")).create()
            except OSError as exc:
                log.debug("cannot reset heartbeat file of rank %d: %s", rank.local_rank, exc)

    def heartbeat(self, rank: Rank) -> tuple[HeartbeatFile | None, HeartbeatState | None]:
        """(the rank's heartbeat file, its current state), or (None, None) when it has none it attached to."""
        if self.details is not None and hasattr(self.details, "heartbeat_path"):
            path = self.details.heartbeat_path(rank.local_rank)
        elif self._dir is not None:  # a missing file fails read() below: no stat every sweep
            path = os.path.join(self._dir, f"rank_{rank.global_rank}.hb")
        else:
            return None, None
        if not path:
            return None, None
        cached = self._files.get(rank.local_rank)
        if cached is None or cached.path != str(path):
            cached = HeartbeatFile(path)
            self._files[rank.local_rank] = cached
        try:
            state = cached.read()
        except (HeartbeatFileError, OSError, ValueError):
            return None, None
        return (cached, state) if state.pid == rank.pid else (None, None)

    def check(self, rank: Rank, now: float) -> Hang | None:
        """The rank's hang, if its heartbeat (or the section it is in) is past its deadline at wall time `now`."""
        _, state = self.heartbeat(rank)
        if state is None:
            return None
        if state.torn:  # a write left half done: the reader kept the last consistent heartbeat, judged below
            log.debug("rank %d: heartbeat file caught mid-write; using its last consistent state", rank.global_rank)
        deadline = state.deadline(self.timeout)
        if deadline is None or now <= deadline:
            return None
        hang = Hang(now - max(state.time, state.section_start or 0.0), state.step, state.section, state.stack_signal)
        step = f" at step {hang.step}" if hang.step is not None else ""
        where = f" in section {hang.section!r}" if hang.section else ""
        log.warning("hang: rank %d (pid %d) made no progress for %.1fs%s%s", rank.global_rank, rank.pid,
                    hang.quiet, step, where)
        return hang

    def record_stacks(self, rank: Rank, stack_signal: int) -> None:
        """Put the hung rank's Python stacks in its log: py-spy when installed, else faulthandler."""
        log_path = self.details.log_path(rank.local_rank) if hasattr(self.details, "log_path") else None
        pyspy = shutil.which("py-spy") if os.environ.get("TASKD_PYSPY", "1") != "0" else None
        if pyspy and log_path and _pyspy_dump(pyspy, rank, log_path):
            return
        if stack_signal:
            log_path = log_path or self._worker_log(rank)
            before = _file_size(log_path)
            try:
                os.kill(rank.pid, stack_signal)
            except ProcessLookupError:
                return
            _wait_for_dump(log_path, before)
            log.info("stacks of rank %d requested with signal %d (see its log)", rank.global_rank, stack_signal)

    def close(self) -> None:
        for hb in self._files.values():
            hb.close()
        if self._dir is not None and os.environ.get(Var.TASKD_HEARTBEAT_DIR) == self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            os.environ.pop(Var.TASKD_HEARTBEAT_DIR, None)


def _pyspy_dump(pyspy: str, rank: Rank, log_path: str) -> bool:
    try:
        out = subprocess.run([pyspy, "dump", "--pid", str(rank.pid)], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(f"--- taskd: stacks of hung rank {rank.global_rank} (py-spy) ---\n")
                fh.write(out.stdout)
            log.info("stacks of rank %d written to %s", rank.global_rank, log_path)
            return True
        log.debug("py-spy dump failed: %s", out.stderr.strip())
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("py-spy dump failed: %s", exc)
    return False


def _file_size(path: str | None) -> int | None:
    try:
        return os.path.getsize(path) if path else None
    except OSError:
        return None


def _wait_for_dump(path: str | None, before: int | None, limit: float = 3.0, quiet: float = 0.2) -> None:
    """Give faulthandler's dump time to reach the rank's log before the rank is killed.

    The dump is written from a C signal handler and copied by whoever drains the rank's
    output, so a fixed pause can lose it on a loaded machine: wait until the log grew and then
    stayed still for `quiet` seconds (at most `limit`); without a log to watch, a short pause.
    """
    if before is None:
        time.sleep(0.3)
        return
    deadline = time.monotonic() + limit
    size, still_since = before, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = _file_size(path)
        if now_size is None:
            return
        if now_size != size:
            size, still_since = now_size, time.monotonic()
        elif size > before and still_since is not None and time.monotonic() - still_since >= quiet:
            return
