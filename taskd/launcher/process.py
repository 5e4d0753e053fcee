"""Spawning one rank: its own session, death with the agent, output through a pipe.

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the
process. Spawn from the main thread or from a thread that lives as long as the
agent; a rank spawned from a short-lived pool thread would be SIGKILLed when
that thread ends.

The death signal is set by exec'ing through util-linux's `setpriv --pdeathsig KILL`,
not by a Python `preexec_fn`: the agent runs gRPC threads, and running Python code in
a child forked from a process with live gRPC threads crashes it (measured: 10 of 40
spawns died with SIGSEGV). `preexec_fn` is only the fallback when setpriv is missing.
Between fork and setpriv's prctl the agent may die unnoticed; a one-line `sh` check of
the parent pid, after the prctl and before exec'ing the rank, closes that window
(the same check `preexec_fn` does with getppid()).

The second half is process hygiene for a child subreaper: finding, signalling and reaping
*orphans* (rank descendants re-parented to us), always by exact pid and start time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _load_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # not Linux
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_prctl = _load_prctl()


def _die_with(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when its spawning thread dies; give up if that already happened."""

    def preexec() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died between fork and prctl
            os._exit(1)

    return preexec


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
    """Reap our child ``pid`` if it has exited (never any other pid); its wait status, else None.

    Never ``waitpid(-1)``: that would steal the exit status of a rank whose Popen,
    or the agent's WNOWAIT peek, still needs it.
    """
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if done == pid else None


SETPRIV = shutil.which("setpriv")
_SH = shutil.which("sh")
# Run by sh after setpriv's prctl: if the agent died before the death signal was armed, the
# rank was already re-parented; give up instead of running as an orphan. $0 is the agent's pid.
_PARENT_CHECK = '[ "$PPID" = "$0" ] || exit 1; exec "$@"'


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
          stdin: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start one rank as a session leader whose stdout+stderr is a pipe; raises OSError if it cannot start."""
    if SETPRIV is not None:
        command = [SETPRIV, "--pdeathsig", "KILL", "--"]
        if _SH is not None:
            command += [_SH, "-c", _PARENT_CHECK, str(os.getpid())]
        command += list(argv)
        preexec = None
    else:
        command = list(argv)
        preexec = _die_with(os.getpid())
    return subprocess.Popen(
        command,
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec,  # noqa: PLW1509 - fallback only, see module docstring
        close_fds=True,
    )


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %d", pgid)
        return False


def has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it (its pid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped (by someone else)
        return True


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for our child ``pid`` to exit, without reaping it; True if it did.

    A pidfd wakes us the moment the process dies (no polling delay in the
    kill-then-respawn path); without pidfds, poll every millisecond.
    """
    if has_exited(pid):
        return True
    if timeout <= 0:
        return False
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(timeout * 1000.0)
        finally:
            os.close(pidfd)
        return has_exited(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if has_exited(pid):
            return True
        time.sleep(0.001)
    return has_exited(pid)


def describe_returncode(code: int | None) -> str:
    """A Popen returncode for event lines: 'exited with code 3', 'killed by SIGKILL', 'running' (None)."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def exit_code_of(code: int | None) -> int:
    """A Popen returncode as a shell would report it: 128 + N for signal N; 1 when unknown (None)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


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
        try:
            proc.send_signal(sig)  # psutil refuses if the pid now names another process
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
