"""msrun's scheduler process, which no launcher callback covers: find it, replace it."""

from __future__ import annotations

import logging
import os
import subprocess

import psutil

from taskd.process.groups import reap_processes
from taskd.process.spawn import SETPRIV

log = logging.getLogger(__name__)


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


def restart_msrun_scheduler(grace: float) -> int | None:
    """Replace msrun's scheduler with a fresh one (same argv, environment, cwd; its log appended).

    Ranks restarted under the old scheduler find it still counting their dead predecessors as
    alive; their first collective then uses stale addresses and fails about 30 s later.
    """
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
