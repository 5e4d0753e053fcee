"""Process-group handling the agent needs beyond the launcher's callbacks: verify, escalate, reap."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable

import psutil

from taskd.launcher.process import SETPRIV, kill_group

log = logging.getLogger(__name__)


def process_group(pid: int) -> int | None:
    """The process group of a live pid, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _group_exists(pgid: int) -> bool:
    """killpg(0) fails only when no process at all, not even a zombie, is left in the group."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def live_group_members(pgids: Iterable[int]) -> dict[int, list[int]]:
    """Non-zombie processes of each group, found by scanning /proc (a group outlives its leader).

    Polled every 10 ms while ranks stop: getpgid (a syscall) sorts every pid, and only a
    group's own members have their /proc status read (reading it for every process on the
    node made each poll ~20x slower).
    """
    wanted = {g for g in pgids if g > 1 and _group_exists(g)}  # the common case needs no scan
    found: dict[int, list[int]] = {}
    if not wanted:
        return found
    for pid in psutil.pids():
        try:
            pgid = os.getpgid(pid)
            if pgid in wanted and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.setdefault(pgid, []).append(pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        if pgid > 1 and pgid != os.getpgrp():  # never signal our own group or init's
            kill_group(pgid, sig)


def wait_groups_gone(pgids: Iterable[int], timeout: float, poll: float = 0.01) -> dict[int, list[int]]:
    """Wait until no live member of the groups is left; return what is still alive at the deadline."""
    deadline = time.monotonic() + timeout
    remaining = live_group_members(pgids)
    while remaining and time.monotonic() < deadline:
        time.sleep(poll)
        remaining = live_group_members(remaining)
    return remaining


def stop_groups(pgids: Iterable[int], grace: float, first_signal: int = signal.SIGTERM) -> dict[int, list[int]]:
    """SIGTERM (or first_signal), wait `grace`, SIGKILL what is left, and confirm; returns survivors."""
    groups = [g for g in set(pgids) if g > 1 and g != os.getpgrp()]
    alive = live_group_members(groups)
    if not alive:
        return {}
    signal_groups(alive, first_signal)
    alive = wait_groups_gone(alive, grace if first_signal != signal.SIGKILL else 5.0)
    if alive and first_signal != signal.SIGKILL:
        log.warning("process groups %s outlived %.1fs of grace: SIGKILL", sorted(alive), grace)
        signal_groups(alive, signal.SIGKILL)
        alive = wait_groups_gone(alive, 5.0)
    if alive:
        log.error("process groups %s survive SIGKILL", sorted(alive))
    return alive


def msrun_schedulers(parent_pid: int | None = None) -> list[psutil.Process]:
    """msrun's scheduler: a child of the msrun process with MS_ROLE=MS_SCHED in its environment."""
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


def reap_processes(procs: list[psutil.Process], grace: float) -> None:
    """Terminate, wait, kill: used for msrun's scheduler, which no callback covers."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5.0)


def restart_msrun_scheduler(grace: float) -> int | None:
    """Replace msrun's scheduler with a fresh one (same argv, environment, cwd; its log appended).

    Ranks restarted under the old scheduler find it still counting their dead predecessors as
    alive; their first collective then uses stale addresses and fails about 30 s later.
    """
    import subprocess

    procs = msrun_schedulers()
    if not procs:
        return None  # not the node that runs the scheduler
    old = procs[0]
    try:
        cmd, env, cwd = old.cmdline(), old.environ(), old.cwd()
        log_path = os.readlink(f"/proc/{old.pid}/fd/1")
    except (psutil.Error, OSError) as exc:
        log.warning("cannot read msrun's scheduler (pid %d): %s; keeping it", old.pid, exc)
        return None
    reap_processes(procs, grace)
    if SETPRIV is not None:  # unlike msrun's own, this scheduler is ours: it must not outlive us
        cmd = [SETPRIV, "--pdeathsig", "KILL", "--", *cmd]
    with open(log_path if log_path.startswith("/") else os.devnull, "ab") as out:
        new = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    log.info("restarted msrun's scheduler (pid %d -> %d)", old.pid, new.pid)
    return new.pid
