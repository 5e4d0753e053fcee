"""One start of one rank (an *incarnation*), and how MONITOR and the rank's log describe it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
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


KEEP_TAILS = 8  # incarnations whose output tail is kept per rank


class RankTable:
    """Every incarnation of every local rank, the current one last; the launcher's lock guards it."""

    def __init__(self, nproc_per_node: int) -> None:
        self.nproc_per_node = nproc_per_node
        self._incarnations: dict[int, list[Incarnation]] = {r: [] for r in range(nproc_per_node)}

    def valid(self, rank: object) -> bool:
        return isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < self.nproc_per_node

    def current(self, rank: int) -> Incarnation | None:
        incs = self._incarnations.get(rank)
        return incs[-1] if incs else None

    def starts(self, rank: int) -> int:
        """How many incarnations ``rank`` had so far."""
        return len(self._incarnations.get(rank, []))

    def fresh_if_idle(self, wait: Callable[[Incarnation], None]) -> RankTable:
        """An empty table for another node rank, once every rank that ran here ended (`wait`: waits for a stopped
        one and reaps it); RuntimeError while one still runs."""
        for inc in self.running():
            wait(inc)
        if self.running():
            raise RuntimeError("the node rank can only change while no rank runs")
        return RankTable(len(self._incarnations))

    def append(self, inc: Incarnation) -> None:
        """Add the rank's new incarnation; old ones beyond KEEP_TAILS drop their output tail."""
        incs = self._incarnations[inc.local_rank]
        incs.append(inc)
        for old in incs[:-KEEP_TAILS]:
            if not old.running:
                old.output.tail.clear()

    def running(self) -> list[Incarnation]:
        return [inc for incs in self._incarnations.values() for inc in incs if inc.running]

    def unreaped_pids(self) -> set[int]:
        """Pids of incarnations whose Popen has not reaped them (never an orphan)."""
        return {inc.popen.pid for incs in self._incarnations.values() for inc in incs
                if inc.popen is not None and inc.popen.returncode is None}

    def running_marks(self, heartbeat_path: Callable[[int], str]) -> tuple[set[int], set[str]]:
        """Sessions and heartbeat files of the running ranks: an orphan with either still belongs to one."""
        running = self.running()
        return {inc.pid for inc in running if inc.pid is not None}, {heartbeat_path(inc.local_rank) for inc in running}
