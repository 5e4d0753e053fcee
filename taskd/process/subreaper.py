"""Process hygiene for a child subreaper: becoming one, and finding, signalling and reaping *orphans*.

An orphan is a rank's descendant re-parented to us. They are always handled by exact pid and
start time: never ``waitpid(-1)``, which would steal the exit status of a rank whose Popen, or
the agent's WNOWAIT peek, still needs it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass

import psutil

from taskd.process.prctl import PR_GET_CHILD_SUBREAPER, PR_SET_CHILD_SUBREAPER
from taskd.process.prctl import prctl as _prctl

log = logging.getLogger(__name__)


def set_child_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux); True on success.

    A rank's grandchild that escapes its process group is then re-parented to
    this process instead of init, where it can still be found and killed. The
    caller must then reap such orphans itself (LocalLauncher does: see
    :func:`acquire_subreaper`).
    """
    if _prctl is None:
        return False
    return _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def is_child_subreaper() -> bool:
    """Whether this process is a child subreaper now (False where prctl is unavailable)."""
    if _prctl is None:
        return False
    flag = ctypes.c_int(0)
    if _prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag), 0, 0, 0) != 0:
        return False
    return flag.value != 0


_subreaper_lock = threading.Lock()
_subreaper_users = 0
_subreaper_ours = False  # we turned it on, so the last release turns it off again
_subreaper_unavailable_logged = False


def acquire_subreaper() -> bool:
    """Be a child subreaper for as long as one launcher needs it; True if this process is one now.

    Counted, so that several launchers in one process share it and the last
    :func:`release_subreaper` restores the state found (a process that was a
    subreaper before stays one). Without prctl (not Linux) this logs once at
    debug and returns False: orphans then go to init as before.
    """
    global _subreaper_users, _subreaper_ours, _subreaper_unavailable_logged
    with _subreaper_lock:
        if _subreaper_users == 0:
            if is_child_subreaper():
                _subreaper_ours = False
            elif set_child_subreaper():
                _subreaper_ours = True
            else:
                if not _subreaper_unavailable_logged:
                    _subreaper_unavailable_logged = True
                    log.debug("cannot become a child subreaper (prctl unavailable): escaped orphans go to init")
                return False
        _subreaper_users += 1
        return True


def release_subreaper() -> None:
    """Undo one successful :func:`acquire_subreaper`."""
    global _subreaper_users, _subreaper_ours
    with _subreaper_lock:
        if _subreaper_users == 0:
            return
        _subreaper_users -= 1
        if _subreaper_users == 0 and _subreaper_ours and _prctl is not None:
            _prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            _subreaper_ours = False


def direct_children(threads: str = "all") -> list[int]:
    """Pids of this process's children; ``threads="main"`` lists only the main thread's.

    /proc/self/task/<tid>/children lists the children one thread forked. Orphans
    re-parented to a subreaper go to its main thread (the kernel picks the thread
    group leader while it lives), so finding them takes one small read instead of
    one per thread; on the exit path of a rank that read competes with the agent
    for the GIL. psutil's scan of every process is the fallback for kernels built
    without CONFIG_PROC_CHILDREN.
    """
    if threads == "main":
        tids = [str(os.getpid())]
    else:
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            tids = []
    pids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/self/task/{tid}"):
                continue  # the thread ended while we looked
            return [p.pid for p in psutil.Process().children()]
        except OSError:
            continue
    return sorted(set(pids))


def reap_exact(pid: int) -> int | None:
    """Reap our child ``pid`` if it has exited (never any other pid); its wait status, else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if done == pid else None


@dataclass(frozen=True)
class Orphan:
    """A direct child this process did not start itself: a rank's descendant re-parented to us.

    ``proc`` pins the process by (pid, create time), so a reused pid is never signalled or reaped.
    """

    proc: psutil.Process
    sid: int
    zombie: bool

    @property
    def pid(self) -> int:
        return self.proc.pid

    def env(self, name: str) -> str | None:
        """A variable of the environment it was started with (inherited from its rank, usually)."""
        try:
            return self.proc.environ().get(name)
        except (psutil.Error, OSError):
            return None


def find_orphans(exclude: set[int], own_sid: int, since: float) -> list[Orphan]:
    """Direct children that are not in ``exclude`` (our Popens), not in our session, created after ``since``.

    Ranks run in sessions of their own, so all they start is outside ours; children an
    embedder starts in the usual way share our session and are left alone.
    """
    found = []
    for pid in direct_children(threads="main"):
        if pid in exclude:
            continue
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                created = proc.create_time()
                zombie = proc.status() == psutil.STATUS_ZOMBIE
            sid = os.getsid(pid)
        except (psutil.Error, OSError):
            continue  # already gone (someone reaped it) or not ours to look at
        if sid == own_sid or created < since:
            continue
        found.append(Orphan(proc, sid, zombie))
    return found


def escaped_descendants(pid: int) -> list[psutil.Process]:
    """Descendants of the group leader ``pid`` that left its process group (a group kill misses them)."""
    try:
        family = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    escaped = []
    for proc in family:
        try:
            if os.getpgid(proc.pid) != pid:
                escaped.append(proc)
        except OSError:
            continue
    return escaped


def signal_tree(orphan: Orphan, sig: int) -> None:
    """Send ``sig`` to the orphan and every descendant it has (they would become orphans next)."""
    try:
        family = [orphan.proc, *orphan.proc.children(recursive=True)]
    except psutil.Error:
        family = [orphan.proc]
    for proc in family:
        send_signal(proc, sig)


def send_signal(proc: psutil.Process, sig: int) -> None:
    """Signal a pinned process; nothing happens if its pid now names another process (psutil checks)."""
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def reap_orphan(orphan: Orphan) -> bool:
    """Reap the orphan if it has exited, by its exact pid and only if that pid is still it; True if reaped."""
    try:
        if not orphan.proc.is_running():  # also True for a zombie; False once the pid is reused
            return False
    except psutil.Error:
        return False
    return reap_exact(orphan.pid) is not None
