"""One I/O thread for every rank of a node: copies rank output to logs and console, watches exits.

It also runs the launcher's periodic tick (reaping orphans that exited by themselves).

A thread per rank would cost a thread per rank and make shutdown ordering hard;
one selector over every pipe (and every rank's pidfd) costs one thread in all.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from taskd.process.pidfd import READ, ExitSelector, open_pidfd

log = logging.getLogger(__name__)

TAIL_LINES = 200
MAX_LINE = 64 * 1024
_console_lock = threading.Lock()


class RankLogError(OSError):
    """A rank log that taskd will not write: a symlink, not a regular file, or another user's file."""


LOG_MODE = 0o640  # owner read/write, group read, others nothing


def open_rank_log(path: str) -> int:
    """Open (create) ``path`` for appending, refusing what a shared --log-dir may hold planted.

    O_NOFOLLOW refuses a symbolic link; O_NONBLOCK keeps a planted FIFO from blocking the open;
    a file that is not regular or not ours is refused too. A new file gets mode 0640, an
    existing one of ours loses any wider bit.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, LOG_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RankLogError(exc.errno, f"refusing rank log {path}: it is a symbolic link (remove it; "
                               "a shared --log-dir must not hold links to other files)") from None
        if exc.errno == errno.ENXIO:
            raise RankLogError(exc.errno, f"refusing rank log {path}: it is a FIFO, not a file") from None
        raise RankLogError(exc.errno, f"cannot open rank log {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RankLogError(errno.EINVAL, f"refusing rank log {path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise RankLogError(errno.EPERM, f"refusing rank log {path}: owned by uid {st.st_uid}, not by this user "
                               "(another user could read the job's output)")
        if st.st_mode & 0o777 & ~LOG_MODE:
            os.fchmod(fd, st.st_mode & LOG_MODE)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class RankLog:
    """A rank's log file, shared by all its incarnations: append only, never truncated (see :func:`open_rank_log`)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = os.fdopen(open_rank_log(path), "ab", buffering=0) if path else None

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write(data)
                except OSError as exc:  # disk full must not stop the job
                    log.warning("cannot write log %s: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


OUT, ERR = "out", "err"


class RankOutput:
    """The output of one incarnation of a rank: log bytes, console lines, a tail.

    One pipe carries stdout and stderr together (their order kept) unless they go different
    ways (``--redirects``/``--tee``): then each has a pipe, fed as ``feed(data, ERR)``, the
    log gets whole lines (so the two never interleave mid-line) and stderr's console lines
    go to this process's stderr. A line that already starts with the rank's prefix (torch
    2.x prefixes its own tracebacks with ``[rankN]:``) is not prefixed again.
    """

    def __init__(self, rank_log: RankLog, prefix: str, console: bool, console_err: bool | None = None,
                 split: bool = False) -> None:
        self.log = rank_log
        self.prefix = prefix
        self._bare_prefix = prefix.rstrip()
        self.console = console
        self.console_err = console if console_err is None else console_err
        self.split = split
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = {OUT: b"", ERR: b""}
        self._open = {OUT, ERR} if split else {OUT}
        self.done = threading.Event()

    def sink(self, stream: str) -> StreamSink:
        """What the I/O thread feeds one pipe into."""
        return StreamSink(self, stream)

    def note(self, line: str) -> None:
        """A line of the launcher's own (e.g. why a spawn failed), kept in log and tail."""
        self.log.write(line.encode() + b"\n")
        self.tail.append(line)
        self._echo([line], OUT)

    def feed(self, data: bytes, stream: str = OUT) -> None:
        if not self.split:
            self.log.write(data)
        data = self._partial[stream] + data
        *complete, self._partial[stream] = data.split(b"\n")
        if len(self._partial[stream]) > MAX_LINE:  # a rank writing without newlines: show it in pieces
            complete.append(self._partial[stream])
            self._partial[stream] = b""
        if complete:
            if self.split:
                self.log.write(b"".join(c + b"\n" for c in complete))
            lines = [c.decode("utf-8", "replace") for c in complete]
            self.tail.extend(lines)
            self._echo(lines, stream)

    def finish(self, stream: str = OUT) -> None:
        partial, self._partial[stream] = self._partial[stream], b""
        if partial:
            self.log.write(partial + b"\n" if self.split else b"\n")
            line = partial.decode("utf-8", "replace")
            self.tail.append(line)
            self._echo([line], stream)
        self._open.discard(stream)
        if not self._open:
            self.done.set()

    def _echo(self, lines: list[str], stream: str) -> None:
        if not (self.console_err if stream == ERR else self.console):
            return
        text = "".join(line + "\n" if line.startswith(self._bare_prefix) else f"{self.prefix}{line}\n"
                       for line in lines)
        with _console_lock:
            try:
                console = sys.stderr if stream == ERR else sys.stdout
                console.write(text)
                console.flush()
            except (OSError, ValueError):  # closed or broken console: the log still has it
                pass


class StreamSink:
    """One pipe's side of a :class:`RankOutput`."""

    def __init__(self, output: RankOutput, stream: str) -> None:
        self.output = output
        self.stream = stream

    def feed(self, data: bytes) -> None:
        self.output.feed(data, self.stream)

    def finish(self) -> None:
        self.output.finish(self.stream)


class OutputPump:
    """The I/O thread: pipes to :class:`RankOutput`, pidfds to exit callbacks, over one :class:`ExitSelector`.

    Registration from other threads goes through a queue and the selector's wake-up pipe, so
    the selector is only ever touched by its own thread.
    """

    def __init__(self, name: str = "taskd-launcher-io", tick: Callable[[], None] | None = None,
                 tick_interval: float = 1.0) -> None:
        """``tick`` runs in the I/O thread about every ``tick_interval`` seconds (the launcher reaps orphans)."""
        self._tick = tick
        self._tick_interval = max(0.01, tick_interval)
        self._sel = ExitSelector()
        self._streams: dict[int, tuple[IO[bytes], RankOutput | StreamSink]] = {}  # reader key (fd) -> (pipe, sink)
        self._exits: dict[object, Callable[[], None]] = {}
        self._keys = itertools.count()  # exit watches get unique keys: a pidfd's number is reused once closed
        self._pending: list[tuple[str, object, object]] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add_stream(self, stream: IO[bytes], sink: RankOutput | StreamSink) -> None:
        self._submit("stream", stream, sink)

    def add_exit_watch(self, pid: int, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (in the I/O thread) as soon as ``pid`` exits; False if pidfds are unavailable."""
        try:
            pidfd = open_pidfd(pid)  # now, while the pid is surely ours: the I/O thread may look later
        except ProcessLookupError:
            return False
        if pidfd is None:
            return False
        self._submit("exit", pidfd, callback)
        return True

    def _submit(self, kind: str, obj: object, data: object) -> None:
        with self._lock:
            if not self._stopping:
                self._pending.append((kind, obj, data))
                self._sel.wake()
                return
        _discard(kind, obj, data)

    def close(self, timeout: float = 2.0) -> None:
        """Drain what the (dead) ranks left in their pipes for up to ``timeout``, then stop; idempotent."""
        with self._lock:
            if not self._stopping:
                self._stopping = True
                self._sel.wake()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("launcher I/O thread did not stop within %.1fs", timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # the job must not lose its supervision silently
            log.exception("launcher I/O thread failed")
        finally:
            self._teardown()

    def _loop(self) -> None:
        drain_deadline = None
        next_tick = _now() + self._tick_interval
        while True:
            timeout = None
            if drain_deadline is not None:
                timeout = max(0.0, drain_deadline - _now())
            elif self._tick is not None:
                timeout = max(0.0, next_tick - _now())
            ready = self._sel.select(timeout)
            self._take_pending()
            for event in ready:
                if event.kind == READ:
                    self._read(event.key)  # type: ignore[arg-type]
                    continue
                callback = self._exits.pop(event.key, None)
                try:
                    if callback is not None:
                        callback()
                except Exception:
                    log.exception("exit callback failed")
            if self._tick is not None and not self._stopping and _now() >= next_tick:
                next_tick = _now() + self._tick_interval
                try:
                    self._tick()
                except Exception:
                    log.exception("launcher tick failed")
            if self._stopping:
                if drain_deadline is None:
                    drain_deadline = _now() + 1.0
                if not self._streams or _now() >= drain_deadline:
                    return

    def _take_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for kind, obj, data in pending:
            if kind == "stream":
                fd = obj.fileno()  # type: ignore[attr-defined]
                self._streams[fd] = (obj, data)  # type: ignore[assignment]
                self._sel.add_reader(fd, fd)
            else:
                key = ("exit", next(self._keys))
                self._exits[key] = data  # type: ignore[assignment]
                self._sel.add_pidfd(key, obj)  # type: ignore[arg-type]

    def _read(self, fd: int) -> None:
        stream, sink = self._streams[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            sink.feed(data)
            return
        self._sel.remove_reader(fd)
        del self._streams[fd]
        stream.close()
        sink.finish()

    def _teardown(self) -> None:
        for fd, (stream, sink) in list(self._streams.items()):
            self._sel.remove_reader(fd)
            stream.close()
            sink.finish()
        self._streams.clear()
        self._exits.clear()
        with self._lock:
            self._stopping = True
            pending, self._pending = self._pending, []
            self._sel.close()  # closes the watched pidfds too
        for kind, obj, data in pending:
            _discard(kind, obj, data)


def _discard(kind: str, obj: object, data: object) -> None:
    """Release a registration the thread will never serve."""
    if kind == "stream":
        obj.close()  # type: ignore[attr-defined]
        data.finish()  # type: ignore[attr-defined]
    else:
        os.close(obj)  # type: ignore[arg-type]


def _now() -> float:
    return time.monotonic()
