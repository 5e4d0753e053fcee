"""Starting, watching and stopping ranks through the launcher's four callbacks (msrun's, or taskd's own).

Mechanics only: what a rank's exit or a failed start *means* is the supervisor's to decide. Every
call runs on the agent's thread (the launcher's callbacks are not thread-safe).

msrun's per-rank logs (`<log_dir>/worker_<rank>.log`) are kept across restarts here too (`MsrunLogs`):
msrun reopens a restarted rank's log with "w", which would erase the traceback of the fault that
caused the restart: before each start after the first, the previous incarnation's log is kept as
`worker_<rank>.log.<n>`. taskd's own launcher appends to its logs itself and needs none of this.
Each incarnation's log ends with one taskd line giving its wall-clock start and end (appended once
the rank is gone: msrun's worker writes through its own file offset, so nothing may be written to a
live rank's log), from which the downtime of a recovery can be read.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from taskd.agent.config import AgentConfig
from taskd.agent.ranks.launcher import Launcher
from taskd.agent.ranks.table import Rank, RankState, RankTable, own_group
from taskd.agent.watches.hangs import HangWatch
from taskd.callbacks import KILL_WORKER, MONITOR, START_ALL_WORKER, START_WORKER_LIST, STATUS_FAILED, STATUS_RUNNING
from taskd.process.groups import process_group, stop_groups, wait_groups_gone
from taskd.process.msrun import MsrunScheduler, stale_msrun_workers
from taskd.process.pidfd import RankWatch
from taskd.worker.env import Var

log = logging.getLogger("taskd.agent")

Entry = dict[str, Any]  # one rank's MONITOR answer: pid, status, global_rank, ...


LauncherDetails = Launcher  # the name embedders import (TaskD's shim): the declared interface, ranks/launcher.py


@dataclass(frozen=True)
class Adopted:
    """A rank just (re)started whose process is already gone, or never started: the caller judges it."""

    rank: Rank
    entry: Entry
    started: bool


class RankControl:
    """The node's ranks as processes: start them, stop them (whole process groups), read their exits."""

    def __init__(self, config: AgentConfig, callbacks: dict[str, Callable[..., Any]],
                 details: Launcher, table: RankTable, watch: RankWatch, hang: HangWatch,
                 logs: MsrunLogs) -> None:
        self.config = config
        self.cb = callbacks
        self.details = details
        self.table = table
        self.watch = watch
        self.hang = hang
        self.logs = logs
        self.sweeps = 0
        # a `--nnodes MIN:MAX` job: the nodes it runs on now, asked before every start of all ranks (None: not
        # elastic, or no answer): the supervisor sets it (agent/ranks/resize.py `present_nodes`)
        self.node_count_now: Callable[[], int | None] | None = None
        # msrun's scheduler, read now (it runs before any rank): a fresh one can be started from this record
        # even after it exited, on the node whose msrun started it
        self.scheduler = MsrunScheduler.find() if config.launcher == "msrun" and not details.rank_files else None

    def monitor(self, local_ranks: list[int]) -> dict[int, Entry]:
        return self.cb[MONITOR](local_ranks) or {}

    def start(self, local: list[int] | None) -> tuple[int, list[Adopted]]:
        """START_ALL_WORKER (local is None) or START_WORKER_LIST(local), then watch the new processes."""
        local_ranks = self.table.local_ranks() if local is None else local
        if not local_ranks:
            return 0, []
        if local is None and self.node_count_now is not None:
            count = self.node_count_now()
            if count is not None:
                if count != self.config.node_count:
                    log.info("ranks start with WORLD_SIZE for the %d of %d node(s) the job runs on now", count,
                             self.config.node_count)
                self.details.set_node_count(count)
        self.logs.before_start({lr: self.table[lr].global_rank for lr in local_ranks})
        self.hang.reset(self.table[lr] for lr in local_ranks)
        self._open_bell()
        code = self.cb[START_ALL_WORKER]() if local is None else self.cb[START_WORKER_LIST](local)
        return code, self._adopt(local_ranks)

    def _adopt(self, local_ranks: list[int]) -> list[Adopted]:
        """Read new pids from MONITOR and watch them; return the ranks that are not running."""
        entries = self.monitor([-1])
        gone = []
        for local_rank in local_ranks:
            rank = self.table[local_rank]
            entry = entries.get(local_rank, {})
            pid = entry.get("pid")
            if pid is None:  # never started: a fault like any other, or the job would wait for it forever
                rank.state, rank.pid = RankState.FAILED, None
                rank.returncode = self.details.returncode(local_rank)
                gone.append(Adopted(rank, entry, started=False))
                continue
            rank.pid, rank.state, rank.returncode = pid, RankState.RUNNING, None
            rank.pgid = own_group(process_group(pid), pid)
            try:
                rank.proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                rank.proc = None
            if not self.watch.watch(local_rank, pid) or entry.get("status") is not STATUS_RUNNING:
                gone.append(Adopted(rank, entry, started=True))
        return gone

    def take_over(self, rank: Rank) -> bool:
        """A migration's successor is the rank's process now (the launcher adopted it): watch it, not its
        predecessor, whose exit is then no event of the rank's. False when the successor is not running."""
        if rank.pid is not None:
            self.watch.unwatch(rank.local_rank, rank.pid)
        self.hang.forget(rank.local_rank)
        return not self._adopt([rank.local_rank])

    def stop(self, ranks: list[Rank], graceful: bool) -> None:
        """Stop ranks and every process of their groups; confirm with psutil before returning."""
        live = [r for r in ranks if r.pid is not None and r.state.alive]
        for rank in live:
            rank.state = RankState.STOPPING
        pgids = [r.pgid or r.pid for r in ranks if r.pid is not None]
        if graceful:  # SIGTERM, grace, SIGKILL, confirmed gone
            stop_groups(pgids, self.config.stop_grace)
        else:  # the launcher's KILL_WORKER, then make sure nothing of the groups is left
            if live:
                self.cb[KILL_WORKER]([r.pid for r in live])
            survivors = wait_groups_gone(pgids, max(self.config.stop_grace, 1.0))
            if survivors:
                stop_groups(survivors, 0.0, first_signal=signal.SIGKILL)
        for rank in live:  # a stopped rank's exit status is never read: no MONITOR round per rank
            self.watch.unwatch(rank.local_rank, rank.pid)
            if rank.state is RankState.STOPPING:
                rank.state = RankState.STOPPED

    def _open_bell(self) -> None:
        """Before the first start: the ranks' doorbell beside their heartbeat files, its path in the environment
        every rank started from here inherits (any launcher's): taskd.worker.env.ring_agent."""
        where = self.hang.files_dir() if self.watch.bell is None else None
        if where and (path := self.watch.open_bell(where)):
            os.environ[Var.TASKD_AGENT_BELL] = path

    def ensure_all_gone(self) -> None:
        if self.watch.bell and os.environ.get(Var.TASKD_AGENT_BELL) == self.watch.bell:  # the job's end
            del os.environ[Var.TASKD_AGENT_BELL]
        try:
            self.cb[KILL_WORKER]([-1])
        except Exception as exc:
            log.warning("KILL_WORKER([-1]) failed: %s", exc)
        pgids = [r.pgid or r.pid for r in self.table.all() if r.pid is not None]
        if pgids:
            stop_groups(pgids, 0.0, first_signal=signal.SIGKILL)

    def exit_status(self, rank: Rank, entry: Entry | None = None) -> tuple[int | None, int | None]:
        """(MONITOR status, raw returncode) of an exited rank; MONITOR can lag the pidfd a little.

        `entry` is a MONITOR answer the caller already holds: asked again only if it still says running.
        """
        deadline = time.monotonic() + 1.0
        while True:
            if entry is None:
                entry = self.monitor([rank.local_rank]).get(rank.local_rank, {})
            status = entry.get("status", STATUS_FAILED)
            if entry.get("pid") not in (None, rank.pid):
                status = STATUS_FAILED  # a newer incarnation: ours is gone
            if status is not STATUS_RUNNING or time.monotonic() > deadline:
                break
            entry = None
            time.sleep(0.001)  # a lagging launcher catches up within a few ms; bounded by the deadline above
        if status is STATUS_RUNNING:
            status = STATUS_FAILED
        try:
            returncode = self.details.returncode(rank.local_rank)
        except Exception:
            returncode = None
        if returncode is None and rank.pid is not None:
            returncode = popen_returncode(self.cb[MONITOR], rank.local_rank, rank.pid)
        if returncode is None:
            returncode = 0 if status == 0 else None
        return status, returncode

    def sweep(self) -> list[tuple[Rank, int, Entry | None]]:
        """What pidfds cannot tell: launcher statuses, zombies, pid reuse.

        Returns (rank, its pid, its MONITOR entry) for each running rank, the entry None when its
        process looks alive (the caller checks it for a hang), all read before the caller acts.
        """
        entries = self.monitor([-1])
        self.sweeps += 1
        found: list[tuple[Rank, int, Entry | None]] = []
        for rank in self.table.all():
            if rank.state is not RankState.RUNNING or rank.pid is None:
                continue
            entry = entries.get(rank.local_rank, {})
            gone = entry.get("status", STATUS_RUNNING) is not STATUS_RUNNING
            if not gone and entry.get("pid") not in (None, rank.pid):
                gone = True
            if not gone:
                gone = self._process_gone(rank)
            if gone:
                self.watch.unwatch(rank.local_rank, rank.pid)
            found.append((rank, rank.pid, entry if gone else None))
        return found

    def _process_gone(self, rank: Rank) -> bool:
        """psutil's view, every 5th sweep: a zombie is dead; a pid whose create time changed was reused.

        A belt to the pidfd's braces (it already turns readable when a rank becomes a zombie), so it
        runs on a slower beat: an idle agent's CPU goes mostly to this otherwise.
        """
        if self.sweeps % 5:
            return False
        proc = rank.proc
        try:  # is_running() is False for a pid that is gone or now names another process
            return proc is None or not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # -- msrun's scheduler, which no callback covers ---------------------------------------------
    def restart_msrun_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.restart(self.config.stop_grace)

    def runs_msrun_scheduler(self) -> bool:
        """This node's msrun started MindSpore's scheduler (it is our child) and one is still running."""
        return self.scheduler is not None and bool(self.scheduler.alive())

    def reap_stale_msrun_workers(self, job_id: str, global_ranks: tuple[int, ...]) -> None:
        """Before this node's ranks first start: SIGKILL the workers of the same ranks that a SIGKILLed msrun of
        this job left on this host (process/msrun.py `is_stale_worker`), each with its process group."""
        if self.config.launcher != "msrun" or not job_id:
            return
        for proc in stale_msrun_workers(job_id, global_ranks):
            try:
                rank = proc.environ().get("RANK_ID")
                target = proc.pid if os.getpgid(proc.pid) == proc.pid else None
                if target is not None:
                    os.killpg(target, signal.SIGKILL)
                else:
                    proc.kill()
            except (psutil.Error, ProcessLookupError, PermissionError) as exc:
                log.warning("cannot stop a worker (pid %d) a previous msrun of this job left: %s", proc.pid, exc)
                continue
            log.warning("killed rank %s's worker (pid %d) that a previous msrun of job %s left running (msrun gives "
                        "its workers no death signal): it would sit in MindSpore's cluster beside this node's "
                        "new rank", rank, proc.pid, job_id)

    def reap_msrun_scheduler(self) -> None:
        if self.config.launcher != "msrun":
            return
        (self.scheduler or MsrunScheduler(None)).reap(self.config.stop_grace)


def popen_returncode(monitor: object, local_rank: int, pid: int) -> int | None:
    """The exit code msrun's own Popen of the rank holds, when the agent could not read it itself.

    The agent peeks at a rank's exit with waitid(WNOWAIT) as the pidfd wakes it; msrun 2.10's MONITOR
    reaps with poll() and then answers only 300 ("failed"), so a MONITOR call that came first left the
    agent "exit status unknown" (1 dump run in 14). The MONITOR callback msrun hands over is a bound
    method of its process manager, whose `proc_rank_map` keeps each local rank's Popen, reaped code and
    all. Read only for the rank's own pid (a newer incarnation's Popen answers nothing); None otherwise.
    """
    procs = getattr(getattr(monitor, "__self__", None), "proc_rank_map", None)
    proc = procs.get(local_rank) if isinstance(procs, dict) else None
    if proc is None or getattr(proc, "pid", None) != pid:
        return None
    code = getattr(proc, "returncode", None)
    return code if isinstance(code, int) else None


class MsrunLogs:
    """Where msrun writes each rank's output, and the rotation that keeps earlier incarnations'."""

    def __init__(self, log_dir: str | None, enabled: bool) -> None:
        self.log_dir = log_dir if enabled else None
        self._starts: dict[int, int] = {}
        self._started_at: dict[int, tuple[int, float]] = {}  # local rank -> (global rank, wall-clock start)

    def worker_log(self, global_rank: int) -> str | None:
        if not self.log_dir:
            return None
        return os.path.join(self.log_dir, f"worker_{global_rank}.log")

    def before_start(self, ranks: dict[int, int]) -> None:
        """Keep the logs of the ranks about to start again ({local rank: global rank})."""
        for local_rank, global_rank in ranks.items():
            path = self.worker_log(global_rank)
            if path is None:
                return
            starts = self._starts.get(local_rank, 0)
            self._starts[local_rank] = starts + 1
            if starts and os.path.exists(path):
                kept = f"{path}.{starts - 1}"
                try:
                    os.replace(path, kept)
                    log.debug("kept the log of rank %d's incarnation %d as %s", local_rank, starts - 1, kept)
                    self._close_incarnation(local_rank, kept, "restarted")
                except OSError as exc:
                    log.warning("cannot keep %s: %s", path, exc)
            self._started_at[local_rank] = (global_rank, time.time())

    def finish(self) -> None:
        """The job ended and every rank is gone: close the last incarnation's log of each rank."""
        for local_rank, (global_rank, _) in list(self._started_at.items()):
            path = self.worker_log(global_rank)
            if path is not None and os.path.exists(path):
                self._close_incarnation(local_rank, path, "job ended")
        self._started_at.clear()

    def _close_incarnation(self, local_rank: int, path: str, why: str) -> None:
        """Append the incarnation's wall-clock start and end to its (dead) rank's log."""
        started = self._started_at.get(local_rank)
        if started is None:
            return
        global_rank, at = started
        number = self._starts.get(local_rank, 1) - (2 if why == "restarted" else 1)
        line = (f"==== taskd: rank {global_rank} (local {local_rank}) start #{number} at {wall_clock(at)}, "
                f"{why} at {wall_clock(time.time())} ====\n")
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            log.debug("cannot close %s: %s", path, exc)


def wall_clock(when: float) -> str:
    """ISO 8601 local time with milliseconds and the UTC offset: 2026-11-30T20:50:09.123+0000."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when)) + f".{int(when % 1 * 1000):03d}" + \
        time.strftime("%z", time.localtime(when))


__all__ = ["Adopted", "LauncherDetails", "RankControl", "popen_returncode"]
