"""Atomic, self-checking checkpoints: a rank killed at any instant never leaves one that loads wrong.

A checkpoint is written to a temporary file in the same directory, fsynced,
renamed into place, and the directory fsynced: a reader sees the old set of
files or the new one, never a partial file. Each file starts with a fixed
header (step, payload length, CRC-32, serializer), filled in last, so a
truncated or damaged file is recognised and skipped on load.

`CheckpointManager.save_async` serializes the state into memory and writes it on a background thread, so
that the rank trains on while the file is written and fsynced; a live recovery holds that writer
(`hold_background_saves`) so that the write takes nothing from it (BENCHMARKS.md).
"""

from __future__ import annotations

import atexit
import importlib.util
import io
import logging
import os
import re
import struct
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_all
from typing import IO, Any

from taskd.worker.serializers import Serializer, get_serializer

log = logging.getLogger(__name__)

MAGIC = b"TASKDCK1"
_HEADER = struct.Struct("<8sIIqQI16s12x")  # magic, version, header size, step, payload length, crc32, serializer
HEADER_SIZE = _HEADER.size  # 64
VERSION = 1
_CHUNK = 1 << 20
_PIECE = 4 << 20  # what a background save writes between two looks at the hold
HOLD_SECONDS = 2.0
"""How long background writes pause when the rank's group breaks (`hold_background_saves`): a live recovery
usually completes in well under that, and no pause outlasts it (nor keeps the interpreter from exiting)."""
EXIT_WAIT = 60.0
"""How long the interpreter's exit waits for background saves still being written; past it they are left
unfinished (the previous checkpoint stays the newest) rather than keep a finished rank from exiting."""
WRITER_NICENESS = 10
"""How much lower the background writer's CPU priority is than the rank's (Linux: per thread): on cores the
training keeps busy it takes what the training leaves (a recovery is protected by the hold, not by this)."""
_OPTIONAL_MODULES = {"torch": "torch", "mindspore": "mindspore"}


class CorruptCheckpoint(Exception):
    """The file is truncated, damaged or not a taskd checkpoint."""


class _Hold:
    """Until when background saves wait: set when the rank's group breaks, so that a checkpoint being written
    takes neither CPU nor the disk from the recovery (on 2 cores it slowed a 4-rank recovery from ~0.4 s to
    ~1 s; BENCHMARKS.md). It only ever extends, and lapses by itself."""

    def __init__(self) -> None:
        self._until = 0.0
        self._changed = threading.Condition()  # an RLock: the SIGCONT hold (worker/continued.py) may re-enter it

    def hold(self, seconds: float) -> None:
        with self._changed:
            self._until = max(self._until, time.monotonic() + seconds)

    def release(self) -> None:
        with self._changed:
            self._until = 0.0
            self._changed.notify_all()

    def wait(self) -> None:
        with self._changed:
            while (remaining := self._until - time.monotonic()) > 0:  # extended or released meanwhile: look again
                self._changed.wait(remaining)


_HOLD = _Hold()


def hold_background_saves(seconds: float = HOLD_SECONDS) -> None:
    """Pause this process's background saves (`CheckpointManager.save_async`) for up to ``seconds``.

    A live rank calls it when it ends a broken group's connections (`taskd.worker.torch_group.GroupSockets`).
    A save pauses before its temporary file, between the pieces it writes and before its fsync; blocking saves
    never pause."""
    _HOLD.hold(seconds)


def release_background_saves() -> None:
    """End a hold now: the saves it paused go on at once. Nothing in a rank calls it (a hold lapses by itself);
    a test holds a save exactly as long as it needs instead of sleeping out a guessed time."""
    _HOLD.release()


class _ChecksummingWriter:
    """A write-only file wrapper that keeps the CRC-32 and length of what passes through, written in pieces; a
    background save waits out a hold (`gate`) before each."""

    def __init__(self, raw: IO[bytes], gate: Callable[[], None] | None = None) -> None:
        self._raw = raw
        self._gate = gate
        self.crc = 0
        self.length = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, _PIECE):  # a held save stops within one piece
            if self._gate is not None:
                self._gate()
            piece = view[start:start + _PIECE]
            self.crc = zlib.crc32(piece, self.crc)
            self._raw.write(piece)
        self.length += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._raw.flush()


class CheckpointManager:
    """Saves a rank's state every so often and finds the newest good one at restart.

    One directory per rank (and per run): files are ``<prefix>-<step>.tkc``; the
    ``keep`` highest steps are kept. ``serializer`` is "pickle" (default), "torch",
    "mindspore" or an object with ``name``, ``dump(state, file)`` and ``load(file)``.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, serializer: str | Serializer = "pickle",
                 prefix: str = "ckpt") -> None:
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive integer, got {keep!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"prefix must be letters, digits, '_' or '.', got {prefix!r}")
        if isinstance(serializer, str) and serializer in _OPTIONAL_MODULES:
            if importlib.util.find_spec(_OPTIONAL_MODULES[serializer]) is None:
                raise ValueError(f"serializer {serializer!r} needs the {_OPTIONAL_MODULES[serializer]} package")
        self.directory = os.fspath(directory)
        self.keep = keep
        self.prefix = prefix
        self.serializer = get_serializer(serializer)
        self._name_re = re.compile(rf"{re.escape(prefix)}-(\d+)\.tkc")
        self._tmp_re = re.compile(rf"\.{re.escape(prefix)}-\d+\.(\d+)\.[0-9a-f]+\.tmp")
        self._pending: Future[str] | None = None  # the background save in flight (or the last one)
        self._pending_pid = 0  # the process that started it (a fork's child inherits no thread)
        self._lock = threading.Lock()
        os.makedirs(self.directory, exist_ok=True)
        self._remove_stale_temps()

    # -- paths -------------------------------------------------------------------------------
    def path_for(self, step: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-{step:012d}.tkc")

    def steps(self) -> list[int]:
        """Steps that have a checkpoint file (not yet verified), ascending."""
        found = []
        for name in os.listdir(self.directory):
            match = self._name_re.fullmatch(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def latest_step(self) -> int | None:
        """The highest step whose checkpoint is intact (checksum verified), or None."""
        for step in reversed(self.steps()):
            try:
                self._verify(self.path_for(step))
                return step
            except CorruptCheckpoint:
                continue
        return None

    # -- save --------------------------------------------------------------------------------
    def save(self, state: Any, step: int) -> str:
        """Write ``state`` as the checkpoint of ``step`` atomically, prune old ones; returns its path.

        Saving a step again replaces its checkpoint atomically (a rank that
        resumed and recomputed steps saves the same steps again).
        """
        _check_step(step)
        return self._save(lambda out: self.serializer.dump(state, out), step, None)

    def _save(self, dump: Callable[[IO[bytes]], None], step: int, gate: Callable[[], None] | None) -> str:
        final = self.path_for(step)
        if gate is not None:
            gate()  # held: not even its temporary file yet
        tmp = os.path.join(self.directory, f".{self.prefix}-{step}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            with open(tmp, "xb") as f:
                f.write(bytes(HEADER_SIZE))  # all zeros: not a checkpoint until the real header lands
                writer = _ChecksummingWriter(f, gate)
                dump(writer)  # type: ignore[arg-type]
                f.flush()
                if gate is not None:
                    gate()  # the fsync writes it all to the disk: not during a recovery either
                header = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, step, writer.length, writer.crc,
                                      self.serializer.name.encode("ascii"))
                f.seek(0)
                f.write(header)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            unlink_if_present(tmp)
            raise
        fsync_dir(self.directory)
        self._prune(keep_step=step)
        log.debug("saved checkpoint of step %d to %s", step, final)
        return final

    def save_async(self, state: Any, step: int, timeout: float | None = None) -> Future[str]:
        """Serialize ``state`` now, in memory, and write and fsync it on a background thread.

        The rank goes on at once while the file is written; what the call costs is the serialization (an
        error of the serializer's raises here). The writing is then only copies, the checksum and the fsync,
        which a recovery can hold (`hold_background_saves`) between any two 4 MB pieces. One save is in
        flight at a time: a call while the previous one is still writing waits for it first, so at most one
        serialized copy is held. The future gives the path, or raises the write's error (which is also
        logged); the interpreter's exit waits for a save in flight (up to `EXIT_WAIT`), and `wait` does before
        reading.
        ``timeout``: how long to wait for the previous save; TimeoutError past it (nothing of this one is done).
        """
        _check_step(step)
        if not self.wait(timeout):
            raise TimeoutError(f"checkpoint of step {step} in {self.directory}: the previous background save is still "
                               f"being written after {timeout} s (a stalled disk?); this one was not taken: retry, "
                               "or call save() to write it in the foreground")
        snapshot = io.BytesIO()  # before returning: the caller's next step changes the state in place
        self.serializer.dump(state, snapshot)
        future: Future[str] = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            self._pending, self._pending_pid = future, os.getpid()
        _IN_FLIGHT.add(future)
        # a daemon thread, so that a stalled disk cannot keep the interpreter from exiting (_InFlight.finish)
        threading.Thread(target=self._save_in_background, args=(snapshot, step, future), daemon=True,
                         name=f"taskd-checkpoint-{step}").start()
        return future

    def _save_in_background(self, snapshot: io.BytesIO, step: int, future: Future[str]) -> None:
        lower_thread_priority(WRITER_NICENESS, "checkpoint writer")
        try:
            path = self._save(lambda out: out.write(snapshot.getbuffer()), step, _HOLD.wait)
        except Exception as exc:  # logged before the future completes: whoever waits on it finds it logged
            log.error("background checkpoint of step %d in %s failed: %s: %s", step, self.directory,
                      type(exc).__name__, exc)
            # the traceback's frames would keep the serialized state alive as long as the future: from where the
            # write failed, without their variables (this frame, which holds the state, is left out)
            traceback.clear_frames(exc.__traceback__)
            future.set_exception(exc.with_traceback(exc.__traceback__.tb_next if exc.__traceback__ else None))
        else:
            future.set_result(path)
        finally:
            _IN_FLIGHT.discard(future)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no background save is in flight; False if one still is after ``timeout`` seconds.

        A failed save does not raise here: its future holds the error, and it was logged."""
        with self._lock:
            future = self._pending
        if future is None or self._pending_pid != os.getpid():  # in a forked child no save of its own is in flight
            return True
        try:
            future.exception(timeout)
        except FutureTimeout:
            return False
        return True

    def _prune(self, keep_step: int) -> None:
        steps = self.steps()
        for step in steps[: max(0, len(steps) - self.keep)]:
            if step != keep_step:
                unlink_if_present(self.path_for(step))

    def _remove_stale_temps(self) -> None:
        """Temporary files of saves that died half-way (their writer is gone)."""
        for name in os.listdir(self.directory):
            match = self._tmp_re.fullmatch(name)
            if match and not pid_alive_elsewhere(int(match.group(1))):
                unlink_if_present(os.path.join(self.directory, name))

    # -- load --------------------------------------------------------------------------------
    def load(self, step: int) -> Any:
        """The state saved for ``step``; raises CorruptCheckpoint or FileNotFoundError."""
        path = self.path_for(step)
        serializer = self._verify(path)
        with open(path, "rb") as f:
            f.seek(HEADER_SIZE)
            try:
                return serializer.load(f)
            except Exception as exc:
                raise CorruptCheckpoint(f"{path}: cannot deserialize: {type(exc).__name__}: {exc}") from exc

    def load_latest(self) -> tuple[Any, int] | None:
        """``(state, step)`` of the newest intact checkpoint, or None.

        A damaged file is skipped with a warning and renamed to ``*.corrupt``.
        """
        for step in reversed(self.steps()):
            try:
                return self.load(step), step
            except FileNotFoundError:  # pruned by a concurrent save
                continue
            except CorruptCheckpoint as exc:
                log.warning("skipping checkpoint of step %d: %s", step, exc)
                self._quarantine(step)
        return None

    def _quarantine(self, step: int) -> None:
        """Set a damaged file aside (kept for inspection) so that pruning never keeps it over good ones."""
        path = self.path_for(step)
        try:
            os.replace(path, path + ".corrupt")
        except OSError as exc:
            log.warning("cannot set %s aside: %s", path, exc)

    def _verify(self, path: str) -> Serializer:
        """Check header, length and checksum; returns the serializer the file was written with."""
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
            if len(raw) < HEADER_SIZE:
                raise CorruptCheckpoint(f"{path}: truncated header ({len(raw)} bytes)")
            magic, version, header_size, step, length, crc, name = _HEADER.unpack(raw)
            if magic != MAGIC or version != VERSION or header_size != HEADER_SIZE:
                raise CorruptCheckpoint(f"{path}: not a taskd checkpoint (version {VERSION})")
            size = os.fstat(f.fileno()).st_size
            if size != HEADER_SIZE + length:
                raise CorruptCheckpoint(f"{path}: {size} bytes, expected {HEADER_SIZE + length} (truncated?)")
            actual = 0
            while chunk := f.read(_CHUNK):
                actual = zlib.crc32(chunk, actual)
            if actual != crc:
                raise CorruptCheckpoint(f"{path}: checksum mismatch")
        try:
            return get_serializer(name.rstrip(b"\0").decode("ascii"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpoint(f"{path}: {exc}") from exc


def _check_step(step: Any) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")


class _InFlight:
    """Every manager's background saves not yet done in this process, so that its exit can wait for them
    (bounded: `EXIT_WAIT`). The exit hook is registered by the first background save, not at import: a process
    that never saves in the background (an agent, msrun) runs none of this."""

    def __init__(self) -> None:
        self._futures: set[Future[str]] = set()
        self._lock = threading.Lock()
        self._pid = 0  # the process whose saves these are; a forked child starts afresh

    def add(self, future: Future[str]) -> None:
        if self._pid != os.getpid():  # this process's first save (a forked child's: its parent's are not its own)
            self._futures, self._lock, self._pid = set(), threading.Lock(), os.getpid()
            atexit.register(self.finish, os.getpid())
        with self._lock:
            self._futures.add(future)

    def discard(self, future: Future[str]) -> None:
        with self._lock:
            self._futures.discard(future)

    def finish(self, pid: int) -> None:
        """At exit: wait for this process's saves in flight, up to `EXIT_WAIT` seconds."""
        if pid != os.getpid():  # registered by the parent before a fork
            return
        with self._lock:
            pending = list(self._futures)
        unfinished = wait_all(pending, timeout=EXIT_WAIT).not_done if pending else set()
        if unfinished:
            log.error("%d background checkpoint(s) still being written after %g s at exit (a stalled disk?): left "
                      "unfinished; the previous checkpoint stays the newest", len(unfinished), EXIT_WAIT)


_IN_FLIGHT = _InFlight()


def lower_thread_priority(niceness: int, who: str) -> None:
    """Run by a background writer thread itself (this one's checkpoints, the agent's snapshot persister): on Linux,
    setpriority(2) of a thread id changes that thread only, so the copy takes what training leaves of the CPU."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except OSError as exc:  # a sandbox without the call: the writer keeps its process's priority
        log.debug("%s keeps its process's CPU priority: %s", who, exc)


def fsync_dir(directory: str) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def pid_alive_elsewhere(pid: int) -> bool:
    """Whether ``pid`` runs and is not this process (whose leftovers no write of its own is in flight for)."""
    if pid == os.getpid():
        return False  # our own leftovers from an earlier, failed save
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
