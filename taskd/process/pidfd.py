"""The one pidfd selector loop: process exits and readable pipes, seen the moment they happen.

A psutil poll every 0.1 s has a p99 of 100 ms; a readable pidfd is seen in well under 1 ms.
:class:`ExitSelector` is the loop's machinery (pidfds, readers, a wake-up pipe). The agent
waits on it through :class:`RankWatch`; the launcher's I/O thread runs it over every rank's
output pipe and pidfd (taskd.launcher.output).

pidfds work for any visible pid (msrun's workers are not our children) but give an exit
status only for our own un-reaped children (:func:`peek_returncode`).
"""

from __future__ import annotations

import logging
import os
import select
import selectors
import socket
from collections.abc import Hashable
from dataclasses import dataclass

log = logging.getLogger(__name__)

EXIT = "exit"
READ = "read"
BELL = "bell"
_WAKEUP = ("wakeup",)
BELL_NAME = "agent.bell"  # the doorbell's socket, beside the ranks' heartbeat files


def wait_readable(fd: int, timeout: float) -> bool:
    """Block until ``fd`` (a pidfd: the process exited) is readable or ``timeout`` passes; True if readable."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000.0))


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (close it yourself); None when pidfds are unavailable (kernel < 5.3, not Linux).

    Raises ProcessLookupError when the process is already gone. Open it while the pid is
    known to be ours (before anyone could reap it), so it cannot name a reused pid.
    """
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (AttributeError, OSError):
        return None


def peek_returncode(pidfd: int) -> int | None:
    """The exit status of an exited child without reaping it (WNOWAIT): its owner still reaps it.

    Returned as Popen gives it (-N for signal N). Works only for our own children that nobody
    reaped yet; otherwise None.
    """
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return None


@dataclass(frozen=True)
class Ready:
    """One event of :meth:`ExitSelector.select`: ``key``'s process exited (EXIT) or its fd is readable (READ)."""

    key: Hashable
    kind: str
    returncode: int | None = None  # EXIT only: see peek_returncode


class ExitSelector:
    """A selector over pidfds and readable fds, plus a wake-up pipe; used by one thread.

    Each watch has a caller-chosen ``key``. An exit is reported once, and its pidfd closed.
    Readers stay registered until :meth:`remove_reader`; their fds belong to the caller.
    :meth:`wake` is safe from other threads and from signal handlers until :meth:`close`.
    """

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKEUP)
        self._pidfds: dict[Hashable, int] = {}
        self._readers: dict[Hashable, int] = {}

    def watch(self, key: Hashable, pid: int) -> bool:
        """Watch ``pid``'s exit under ``key``; False when it is already gone. OSError without pidfd support."""
        if key in self._pidfds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        self.add_pidfd(key, fd)
        return True

    def add_pidfd(self, key: Hashable, pidfd: int) -> None:
        """Watch a pidfd opened by the caller (the selector owns and closes it from now on)."""
        if key in self._pidfds:
            os.close(pidfd)
            return
        self._pidfds[key] = pidfd
        self._selector.register(pidfd, selectors.EVENT_READ, (EXIT, key))

    def unwatch(self, key: Hashable) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            self._selector.unregister(fd)
            os.close(fd)

    def watched(self) -> list[Hashable]:
        return list(self._pidfds)

    def add_reader(self, key: Hashable, fd: int) -> None:
        self._readers[key] = fd
        self._selector.register(fd, selectors.EVENT_READ, (READ, key))

    def remove_reader(self, key: Hashable) -> None:
        fd = self._readers.pop(key, None)
        if fd is not None:
            self._selector.unregister(fd)

    def add_bell(self, fd: int) -> None:
        """A non-blocking socket whose datagrams only wake :meth:`select`, drained there like the wake-up pipe
        (the fd stays the caller's: remove it with `remove_reader(fd)` before closing it)."""
        self._readers[fd] = fd
        self._selector.register(fd, selectors.EVENT_READ, (BELL, fd))

    def wake(self) -> None:
        """Interrupt :meth:`select` from another thread or a signal handler."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # full (already awake) or closed
            pass

    def select(self, timeout: float | None) -> list[Ready]:
        """Wait up to ``timeout`` (None: forever) for events; [] on timeout or wake-up."""
        ready: list[Ready] = []
        for key, _ in self._selector.select(None if timeout is None else max(0.0, timeout)):
            kind, watch_key = key.data[0], key.data[-1]
            if key.data is _WAKEUP:
                self._drain(self._wake_r)
            elif kind == BELL:
                self._drain(key.fd)
            elif kind == READ:
                ready.append(Ready(watch_key, READ))
            else:
                returncode = peek_returncode(key.fd)
                self.unwatch(watch_key)
                ready.append(Ready(watch_key, EXIT, returncode))
        return ready

    @staticmethod
    def _drain(fd: int) -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:  # BlockingIOError: drained
            pass

    def close(self) -> None:
        """Close every pidfd and the wake-up pipe (readers' fds are the caller's); idempotent."""
        for key in list(self._pidfds):
            self.unwatch(key)
        for key in list(self._readers):
            self.remove_reader(key)
        if self._wake_r < 0:
            return
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1


def _unlink_if_dead(path: str) -> None:
    """Remove a doorbell a SIGKILLed agent left (nothing receives on it: connecting is refused), so that the next
    agent of a heartbeat directory the user named can bind there; a live agent's is left alone."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as probe:
            probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
    except OSError:  # no such file (the usual case), or not ours to judge
        pass


@dataclass(frozen=True)
class Exit:
    local_rank: int
    pid: int
    returncode: int | None = None  # as Popen gives it (-N for signal N); None when it could not be read


class RankWatch:
    """The agent's view of :class:`ExitSelector`: rank pidfds by (local rank, pid); ``wait()`` returns exits."""

    def __init__(self) -> None:
        self._selector = ExitSelector()
        self._bell: socket.socket | None = None
        self.bell: str | None = None  # the doorbell's path (`open_bell`)

    def open_bell(self, directory: str) -> str | None:
        """A doorbell that wakes ``wait()`` the moment a rank rings it (`taskd.worker.env.ring_agent`), so the
        agent need not read its ranks' files every few ms to see what they write: a Unix datagram socket in
        `directory` (the ranks' heartbeat directory: private to the job's user, removed with the job). Its path
        (the caller tells the ranks); None where it cannot be made (the caller then keeps reading often)."""
        if self._bell is not None:
            return self.bell
        path = os.path.join(directory, BELL_NAME)
        try:
            self._bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            _unlink_if_dead(path)
            self._bell.bind(path)
        except OSError as exc:  # e.g. a path past the 107 bytes a socket's name may have
            log.info("no doorbell for the ranks at %s (%s): their files are read every 50 ms instead", path, exc)
            self._close_bell()
            return None
        self._selector.add_bell(self._bell.fileno())
        self.bell = path
        return path

    def _close_bell(self) -> None:
        if self._bell is not None:
            self._selector.remove_reader(self._bell.fileno())
            self._bell.close()
            self._bell = None
        if self.bell is not None:
            try:
                os.unlink(self.bell)
            except OSError:
                pass
            self.bell = None

    def watch(self, local_rank: int, pid: int) -> bool:
        """Start watching; False when the pid is already gone (the caller treats it as an exit)."""
        return self._selector.watch((local_rank, pid), pid)

    def unwatch(self, local_rank: int, pid: int) -> None:
        self._selector.unwatch((local_rank, pid))

    def watched(self) -> list[tuple[int, int]]:
        return self._selector.watched()  # type: ignore[return-value]

    def wake(self) -> None:
        """Interrupt `wait()` from another thread or a signal handler."""
        self._selector.wake()

    def wait(self, timeout: float) -> list[Exit]:
        """The exits seen within ``timeout``, or [] on timeout/wake-up."""
        return [Exit(r.key[0], r.key[1], r.returncode)  # type: ignore[index]
                for r in self._selector.select(max(0.0, timeout)) if r.kind == EXIT]

    def close(self) -> None:
        self._close_bell()
        self._selector.close()
