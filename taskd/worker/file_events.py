"""Waiting for a file to be replaced without polling it: Linux inotify, through ctypes.

A live rank's leave watch used to `stat` the control file every 5 ms. With 8 ranks on 2 cores those
1,600 wake-ups a second took 10-18 % of each rank's CPU (BENCHMARKS.md, "LiveGroup's steady-state cost"):
the thread blocks here instead, woken by the kernel when the agent renames a new control file into place
(`taskd.worker.live.write_control`'s ``os.replace``). Standard library only (ranks import taskd.worker).
Where inotify is missing (not Linux, or the user's ``fs.inotify.max_user_instances`` is used up) `open`
returns None and the caller polls as before.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import select
import struct
import time

log = logging.getLogger(__name__)

_IN_CLOSE_WRITE = 0x00000008  # <sys/inotify.h>
_IN_MOVED_TO = 0x00000080
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name (NUL-padded)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - raises AttributeError where there is no inotify
        libc.inotify_add_watch  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class FileReplaced:
    """An inotify watch on a file's directory that reports the file being renamed into place or rewritten."""

    def __init__(self, fd: int, name: bytes) -> None:
        self._fd = fd
        self._name = name
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    @classmethod
    def open(cls, path: str) -> FileReplaced | None:
        """Watch ``path`` (its directory must exist); None where inotify cannot be had (the caller polls)."""
        libc = _libc()
        if libc is None:
            return None
        directory, name = os.path.split(os.path.abspath(path))
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.debug("inotify_init1: %s; polling %s", os.strerror(ctypes.get_errno()), path)
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_MOVED_TO | _IN_CLOSE_WRITE | _IN_ONLYDIR) < 0:
            log.debug("inotify_add_watch %s: %s; polling", directory, os.strerror(ctypes.get_errno()))
            os.close(fd)
            return None
        return cls(fd, os.fsencode(name))

    def wait(self, timeout: float) -> bool:
        """Block until the file is replaced or rewritten (True) or ``timeout`` seconds pass (False); OSError if
        the watch itself fails (the caller then polls)."""
        deadline = time.monotonic() + timeout
        while True:  # an event of another file (write_control's temporary one, first) is no answer yet
            left = deadline - time.monotonic()
            ready = self._poll.poll(max(0, math.ceil(left * 1000)))
            if ready and self._drain():
                return True
            if not ready or left <= 0:
                return False

    def _drain(self) -> bool:
        """Read the queued events; True if one names the file."""
        hit = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:  # every queued event read
                return hit
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                hit = hit or name == self._name
                offset += _EVENT.size + length

    def close(self) -> None:
        try:
            self._poll.unregister(self._fd)
        except (KeyError, ValueError):
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass


class FileWatch:
    """Sleeping until a file may have changed, for a loop that looks at it each time it wakes: inotify
    (`FileReplaced`) with a look every ``idle`` seconds regardless, else (no inotify, or the watch failed) a poll
    every ``interval``. One mechanism for the leave watch's thread and a rank waiting for its generation."""

    def __init__(self, path: str, interval: float, idle: float) -> None:
        self.path, self.interval, self.idle = path, interval, idle
        self._events = FileReplaced.open(path)

    def pause(self, limit: float = float("inf")) -> None:
        """Return when the file was replaced or rewritten, ``idle`` (polling: ``interval``) or ``limit`` s passed."""
        if self._events is not None:
            try:
                self._events.wait(min(self.idle, limit))
                return
            except OSError:  # the watch broke: the caller must outlive it, so it polls from here on
                log.debug("inotify failed; polling %s", self.path, exc_info=True)
                self._events.close()
                self._events = None
        time.sleep(max(0.0, min(self.interval, limit)))

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
