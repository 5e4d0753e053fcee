"""msrun's scheduler process, which no launcher callback covers: find it, record it, replace it."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psutil

from taskd.process.groups import reap_processes
from taskd.process.spawn import dying_with_us

log = logging.getLogger(__name__)


def msrun_schedulers(parent_pid: int | None = None) -> list[psutil.Process]:
    """msrun's scheduler: a child of the msrun process with MS_ROLE=MS_SCHED in its environment.

    A scheduler that exited (a zombie msrun never waits for) has no readable environment: not listed.
    """
    found = []
    try:
        children = psutil.Process(parent_pid or os.getpid()).children(recursive=False)
    except psutil.Error:
        return found
    for child in children:
        try:
            if child.environ().get("MS_ROLE") == "MS_SCHED":
                found.append(child)
        except psutil.Error:
            continue
    return found


def is_stale_worker(env: Mapping[str, str], parent_env: Mapping[str, str] | None, job_id: str,
                    global_ranks: Iterable[int]) -> bool:
    """A worker of one of these ranks of job `job_id` whose msrun is gone: msrun starts its workers in sessions
    of their own with no death signal, so a SIGKILLed msrun leaves them running, and one of a node's ranks
    then sits in MindSpore's cluster beside its replacement (the fresh scheduler answered its heartbeats
    "Invalid node", ended early, and the replacement's rank never unregistered). Its parent (`parent_env`,
    None when gone or unreadable) is then init or a subreaper, not an msrun of the job."""
    if not job_id or env.get("MINDX_TASK_ID") != job_id or env.get("MS_ROLE") != "MS_WORKER":
        return False
    if env.get("RANK_ID") not in {str(r) for r in global_ranks}:
        return False
    return parent_env is None or parent_env.get("MINDX_TASK_ID") != job_id


def stale_msrun_workers(job_id: str, global_ranks: Iterable[int]) -> list[psutil.Process]:
    """This host's workers of `global_ranks` left by a dead msrun of job `job_id` (`is_stale_worker`)."""
    ranks = tuple(global_ranks)
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid == os.getpid():
                continue
            env = proc.environ()
            if env.get("MINDX_TASK_ID") != job_id:
                continue
            parent = proc.parent()
            if parent is not None and _concealed(parent):
                continue  # its msrun, alive: a taskd agent hides its environment (taskd/process/conceal.py)
            try:
                parent_env = parent.environ() if parent is not None else None
            except psutil.Error:
                parent_env = None
            if is_stale_worker(env, parent_env, job_id, ranks):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _concealed(proc: psutil.Process) -> bool:
    """One of this user's live msruns that refuses its environment to this user: a taskd agent inside it. Its
    command line must name msrun: init or a subreaper that an orphan was handed to may refuse its environment
    too (pid 1 did, here), and the orphan is then exactly the stale worker looked for."""
    try:
        proc.environ()
    except psutil.AccessDenied:
        try:
            return proc.uids().real == os.getuid() and any("msrun" in part for part in proc.cmdline())
        except psutil.Error:
            return False
    except psutil.Error:
        return False
    return False


@dataclass(frozen=True)
class SchedulerRecord:
    """What it takes to start msrun's scheduler again: its command line, environment, working directory, log."""

    cmd: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: str
    log_path: str | None  # its stdout (msrun's `<log_dir>/scheduler.log`); None if not a file


def record_msrun_scheduler(parent_pid: int | None = None) -> SchedulerRecord | None:
    """Read msrun's running scheduler; None on a node whose msrun started none (not node 0), or if unreadable."""
    for proc in msrun_schedulers(parent_pid):
        record = _read(proc)
        if record is not None:
            return record
    return None


def _read(proc: psutil.Process) -> SchedulerRecord | None:
    try:
        cmd, env, cwd = proc.cmdline(), proc.environ(), proc.cwd()
    except psutil.Error as exc:
        log.warning("cannot read msrun's scheduler (pid %d): %s", proc.pid, exc)
        return None
    try:
        out = os.readlink(f"/proc/{proc.pid}/fd/1")
    except OSError:
        out = ""
    return SchedulerRecord(cmd, env, cwd, out if out.startswith("/") and os.path.isfile(out) else None)


class MsrunScheduler:
    """The scheduler of this node's msrun, as the agent found it at the start, and the fresh ones it starts.

    A job-rescheduling restarts the scheduler with every rank: ranks restarted under the old one find it
    still counting their dead predecessors as alive, and their first collective then uses stale addresses
    and fails about 30 s later. The scheduler may also be gone already (it exited by itself, or was
    killed); the ranks would then retry "Failed to connect to the meta server node" without end. So the
    record taken at the start is what a fresh scheduler is started from, whether or not one still runs.
    """

    def __init__(self, record: SchedulerRecord | None) -> None:
        self.record = record
        self._ours: list[subprocess.Popen[bytes]] = []  # the ones we started (msrun reaps none of them)

    @classmethod
    def find(cls, parent_pid: int | None = None) -> MsrunScheduler:
        record = record_msrun_scheduler(parent_pid)
        if record is not None:
            log.debug("msrun's scheduler recorded: %s (cwd %s, log %s)", " ".join(record.cmd), record.cwd,
                      record.log_path)
        return cls(record)

    def alive(self) -> list[psutil.Process]:
        """The schedulers running now (msrun's own, or one we started)."""
        self._collect()
        return [p for p in msrun_schedulers() if _running(p)]

    def restart(self, grace: float) -> int | None:
        """Reap the scheduler if it still runs, then start a fresh one from the record; its pid, or None
        on a node that runs none."""
        if self.record is None:
            return None
        running = msrun_schedulers()
        old = ", ".join(str(p.pid) for p in running) if running else None
        if running:
            reap_processes(running, grace)
        self._collect()
        pid = self._start()
        if old is None:
            log.warning("msrun's scheduler had exited; started a fresh one (pid %d) from its recorded command "
                        "line", pid)
        else:
            log.info("restarted msrun's scheduler (pid %s -> %d)", old, pid)
        return pid

    def reap(self, grace: float) -> None:
        """End every scheduler of this node (msrun's, ours) and collect their exit statuses."""
        running = [p for p in msrun_schedulers() if _running(p)]
        if running:
            log.info("reaping msrun's scheduler (pid %s)", ", ".join(str(p.pid) for p in running))
            reap_processes(running, grace)
        self._collect()

    def _start(self) -> int:
        record = self.record
        assert record is not None
        cmd, preexec = dying_with_us(record.cmd)  # unlike msrun's own, this scheduler is ours: it must not outlive us
        with open(record.log_path or os.devnull, "ab") as out:  # appended: the earlier scheduler's lines stay
            proc = subprocess.Popen(cmd, env=record.env, cwd=record.cwd, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=preexec)  # noqa: PLW1509 - only without setpriv, as spawn()
        self._ours.append(proc)
        return proc.pid

    def _collect(self) -> None:
        """Wait for the schedulers we started that have exited (no zombies left in msrun)."""
        self._ours = [p for p in self._ours if p.poll() is None]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def restart_msrun_scheduler(grace: float) -> int | None:
    """Replace this msrun's running scheduler with a fresh one (same argv, environment, cwd; its log appended).

    Reads the scheduler that runs now: a node whose scheduler already exited gets None here. The agent
    records it at the start instead (`MsrunScheduler`), so that it can start one even then.
    """
    return MsrunScheduler.find().restart(grace)


__all__ = ["MsrunScheduler", "SchedulerRecord", "msrun_schedulers", "record_msrun_scheduler",
           "restart_msrun_scheduler"]
