"""Spawning one rank: its own session, death with the agent, output through a pipe.

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the
process. Spawn from the main thread or from a thread that lives as long as the
agent; a rank spawned from a short-lived pool thread would be SIGKILLed when
that thread ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


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

    Optional for an agent: a rank's grandchild that escapes its process group is
    then re-parented to the agent instead of init, where psutil can still find it.
    The caller must then reap such orphans itself.
    """
    if _prctl is None:
        return False
    return _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start one rank as a session leader whose stdout+stderr is a pipe; raises OSError if it cannot start."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - deliberate, see module docstring
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
