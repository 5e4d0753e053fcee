"""One start of one rank (an *incarnation*), and how MONITOR and the rank's log describe it."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

from taskd.callbacks import STATUS_FAILED, STATUS_OK
from taskd.launcher.output import RankOutput

SPAWN_FAILED_CODE = 127  # returncode reported for a rank whose process could not be started


@dataclass
class Incarnation:
    """One start of one rank."""

    local_rank: int
    global_rank: int
    restart: int  # how many times the rank was started before this one
    popen: subprocess.Popen[bytes] | None
    output: RankOutput
    started_at: float = field(default_factory=time.time)
    returncode: int | None = None
    ended_at: float | None = None
    error: str | None = None  # why it could not be started
    killed: bool = False  # SIGKILL sent to its group by KILL_WORKER

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.returncode is None

    @property
    def status(self) -> int | None:
        """MONITOR's status: None running, 0 exited 0, 300 ended any other way."""
        if self.running:
            return None
        return STATUS_OK if self.returncode == 0 else STATUS_FAILED

    def header(self) -> str:
        """The line that opens the incarnation's part of the rank's log."""
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started_at))
        pid = self.pid if self.pid is not None else "-"
        who = f"rank {self.global_rank} (local {self.local_rank})"
        return f"==== taskd: {who} start #{self.restart} pid {pid} at {when} ====\n"
