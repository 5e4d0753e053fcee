"""Process groups the agent stops and confirms gone: verify, escalate, reap.

Ranks lead process groups of their own, and a group outlives its leader; so stopping a rank
means signalling its group and checking /proc until no live member is left.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable

import psutil

from taskd.process.spawn import kill_group

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
    """Signal each group, never our own group or init's."""
    for pgid in pgids:
        if pgid > 1 and pgid != os.getpgrp():
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


def reap_processes(procs: list[psutil.Process], grace: float) -> None:
    """Terminate, wait, kill: for processes no launcher callback covers (msrun's scheduler)."""
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
