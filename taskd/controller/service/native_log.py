"""gRPC core's own log lines that any peer can cause at will, rate-limited (issue 19, N6).

gRPC's C core writes to file descriptor 2 directly, below Python's logging: 2,000 plaintext
connections to a TLS server wrote 2,000 "Handshake failed" lines. The standalone `taskd server`
therefore puts a pipe on fd 2 and copies what arrives to the real stderr, except that lines matching
`NOISY` pass at most once per `interval` seconds per pattern; the next one that passes says how many
were held back. Everything else (Python's logging included) passes unchanged, in order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

NOISY = (b"Handshake failed", b"handshake failed", b"Failed to create secure transport")


class NativeLogFilter:
    """`install()` once per process; the copying thread is a daemon and never blocks the writers for long."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[bytes, float] = {}
        self._held: dict[bytes, int] = {}
        self._out = -1
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        read, write = os.pipe()
        self._out = os.dup(2)
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._copy, args=(read,), name="taskd-native-log", daemon=True)
        self._thread.start()

    def uninstall(self, timeout: float = 2.0) -> None:
        """The real stderr back on fd 2; what was still in the pipe is copied first (the pipe ends with it)."""
        if self._thread is None:
            return
        os.dup2(self._out, 2)  # the pipe's last writer is gone: the thread reads to its end and stops
        self._thread.join(timeout)
        self._thread = None
        for pattern, held in self._held.items():
            note = f"{held} more gRPC line(s) with {pattern.decode()!r} were not shown (rate-limited)\n"
            _write_all(2, note.encode())
        self._held.clear()

    def filter(self, line: bytes) -> bytes:
        """What to write for one line: the line, the line with a count of the ones held back, or nothing."""
        pattern = next((p for p in NOISY if p in line), None)
        if pattern is None:
            return line
        now = self.clock()
        if now - self._last.get(pattern, -self.interval) < self.interval:
            self._held[pattern] = self._held.get(pattern, 0) + 1
            return b""
        self._last[pattern] = now
        held = self._held.pop(pattern, 0)
        if not held:
            return line
        note = f" ({held} more like it in the last {self.interval:g}s not shown)".encode()
        return line.rstrip(b"\n") + note + b"\n"

    def _copy(self, read: int) -> None:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out = b"".join(self.filter(line + b"\n") for line in lines)
                _write_all(self._out, out)
            _write_all(self._out, self.filter(pending) if pending else b"")


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:  # stderr gone: nothing to write to
            return
