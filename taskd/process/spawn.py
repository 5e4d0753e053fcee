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
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from taskd.process.pidfd import wait_readable
from taskd.process.prctl import PR_SET_PDEATHSIG, prctl

log = logging.getLogger(__name__)

SETPRIV = shutil.which("setpriv")
_SH = shutil.which("sh")
# Run by sh after setpriv's prctl: if the agent died before the death signal was armed, the
# rank was already re-parented; give up instead of running as an orphan. $0 is the agent's pid.
_PARENT_CHECK = '[ "$PPID" = "$0" ] || exit 1; exec "$@"'


def _die_with(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGKILL this child when its spawning thread dies; give up if that already happened."""

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died between fork and prctl
            os._exit(1)

    return preexec


def dying_with_us(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The command line and preexec_fn that make a child die with the calling thread (see the module's doc)."""
    if SETPRIV is None:
        return list(argv), _die_with(os.getpid())
    command = [SETPRIV, "--pdeathsig", "KILL", "--"]
    if _SH is not None:
        command += [_SH, "-c", _PARENT_CHECK, str(os.getpid())]
    return command + list(argv), None


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
          stdin: int = subprocess.DEVNULL, split_stderr: bool = False) -> subprocess.Popen[bytes]:
    """Start one rank as a session leader whose output is a pipe; raises OSError if it cannot start.

    stdout and stderr share one pipe (their order kept), unless ``split_stderr``: then stderr
    has a pipe of its own (``popen.stderr``), for callers that route the two streams apart.
    """
    command, preexec = dying_with_us(argv)
    return subprocess.Popen(
        command,
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split_stderr else subprocess.STDOUT,
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
            wait_readable(pidfd, timeout)
        finally:
            os.close(pidfd)
        return has_exited(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if has_exited(pid):
            return True
        time.sleep(0.001)
    return has_exited(pid)


def reap(popen: subprocess.Popen[bytes], what: str, timeout: float = 5.0) -> None:
    """Reap a child that died or was SIGKILLed, waiting at most ``timeout`` (never hang a restart or a shutdown),
    and close its pipes (closing stdin may flush into a dead process: OSError is expected)."""
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("%s %d did not die within %g s of SIGKILL", what, popen.pid, timeout)
    for stream in (popen.stdin, popen.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
