"""The per-rank heartbeat file shared by a rank (writer) and its agent (reader).

A small fixed binary layout in a memory-mapped file, so that a heartbeat costs a
few microseconds (a struct write into shared memory, no syscall) and the agent
can read it at any time without talking to the rank. The rank's fields are
guarded by a sequence counter (odd while a write is in progress) so the agent
never sees a torn update. A rank killed in the middle of a write leaves the
counter odd for good: the reader then says so (``HeartbeatState.torn``) instead
of returning the half-written bytes. The save-request counter is the only field the agent
writes; the rank answers through the acknowledgement fields.

Layout (little-endian, ``SIZE`` bytes):

======  ====  ===============================================================
offset  type  field
======  ====  ===============================================================
0       4s    magic ``b"TKHB"``
4       u32   layout version
8       u64   sequence counter (rank side; odd = write in progress)
16      i32   pid of the rank that last attached
20      u32   signal number on which the rank dumps its Python stacks (0 = none)
24      f64   wall time of the last heartbeat (0 = none yet)
32      i64   step of the last heartbeat (-1 = unknown)
40      f64   timeout of the current section in seconds (0 = none)
48      f64   wall time the current section was entered (0 = none)
56      u64   save requests issued (agent side)
64      u64   save requests acknowledged (rank side)
72      u32   1 if the last acknowledged save succeeded, else 0
76      u32   length of the section name in bytes
80      64s   section name, UTF-8
144     u64   number of heartbeats written
152     u32   live flags (rank side): 1 = can rejoin a rebuilt group in place, 2 = can retry a step in place
156     u32   live phase: 0 training, 1 paused (waiting for a generation), 2 rejoining, 3 gave up
160     i64   generation of the group the rank last joined
168     i64   step the rank resumed from when it joined that generation
176     f64   wall time it joined that generation (0 = never joined one)
184     f64   wall time it entered the collective it is in now (0 = not inside one)
192     u64   in-place errors reported (a counter: the agent sees each one once)
200     u32   kind of the last one: 1 retryable exception, 2 collective timeout, 3 collective error (peer lost)
204     i64   step it happened in
212     f64   wall time it happened
220     u32   finishing (rank side): 0 no, 1 its interpreter is exiting (atexit), 2 the script said its
              work is done (``taskd.worker.finished()``)
224     f64   wall time it was marked finishing (0 = not finishing)
232     f64   compute seconds (rank side): the time between consecutive heartbeats not spent inside a
              collective (``taskd.worker.collective()``, LiveGroup's marks), summed
240     u64   heartbeat intervals that sum counts
248     f64   continue handshake (both sides, outside the sequence counter): the rank writes -T (T its
              monotonic time when it was continued after a stop, SIGCONT) to ask whether its node is still its
              own; the agent answers +S, S the monotonic time it asked the controller (S >= T). 0 = never asked
======  ====  ===============================================================

Bytes 152-219 are the live-recovery fields (``taskd.worker.live``); all zero means "not declared".
A finishing rank is not hung: framework finalisation at exit (MindSpore's takes seconds) sends no
heartbeats. The agent still bounds how long it waits for such a rank to exit.

Bytes 248-255 hold a rank back after a stop (``taskd.worker.continued``, issue 31): a whole node SIGSTOPped
until it was declared lost and replaced must not write a step when it is continued, before its agent learns it
was fenced (CLOCK_MONOTONIC is one clock for every process of the machine).

Bytes 232-247 are a rank's own pace (issue 21, stragglers): in data-parallel training every rank steps
at the slowest's pace, so the step time cannot name the slow rank, but the time a rank spends *outside*
its collectives can. Zero means not measured (an older writer, or no two heartbeats yet): readers that
do not know the fields ignore them, and the layout version stays 1.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import NamedTuple

MAGIC = b"TKHB"
VERSION = 1
SIZE = 256
SECTION_MAX = 64

HEADER = struct.Struct("<4sI")  # offset 0
SEQ = struct.Struct("<Q")  # offset 8
IDENT = struct.Struct("<iI")  # offset 16: pid, stack signal
BEAT = struct.Struct("<dq")  # offset 24: time, step
SECTION = struct.Struct("<dd")  # offset 40: timeout, start
REQUEST = struct.Struct("<Q")  # offset 56
ACK = struct.Struct("<QI")  # offset 64: ack, ok
NAME = struct.Struct("<I64s")  # offset 76: length, name
COUNT = struct.Struct("<Q")  # offset 144
ALL = struct.Struct("<4sIQiIdqddQQII64sQ")  # the whole record, for one-shot reads
LIVE = struct.Struct("<IIqqddQIqd")  # offset 152: the live-recovery fields, see taskd.worker.live
U32 = struct.Struct("<I")
FINISH = struct.Struct("<Id")  # offset 220: finishing state, since (packed: 220 + 4 = 224)
COMPUTE = struct.Struct("<dQ")  # offset 232: compute seconds, intervals counted
CONTINUE = struct.Struct("<d")  # offset 248: the continue handshake

OFF_SEQ = 8
OFF_IDENT = 16
OFF_BEAT = 24
OFF_SECTION = 40
OFF_REQUEST = 56
OFF_ACK = 64
OFF_NAME = 76
OFF_COUNT = 144
OFF_LIVE = 152
OFF_LIVE_FLAGS = 152
OFF_LIVE_PHASE = 156
OFF_LIVE_JOIN = 160  # generation, step, time
OFF_LIVE_COLLECTIVE = 184
OFF_LIVE_ERROR = 192  # count, kind, step, time
OFF_FINISH = 220
OFF_COMPUTE = 232
OFF_CONTINUE = 248

FINISHING_NO = 0
FINISHING_EXIT = 1  # the rank's interpreter is exiting (its atexit handlers run)
FINISHING_DONE = 2  # the script said its work is done


class HeartbeatFileError(Exception):
    """The file is missing, too small or not a heartbeat file."""


class HeartbeatState(NamedTuple):
    """One consistent snapshot of a rank's heartbeat file.

    ``time`` is 0.0 until the rank's first heartbeat: no heartbeat yet means the
    agent should not apply a hang check. ``section`` is "" outside any section.

    ``torn`` is True when no consistent copy could be read: the rank died (or is
    frozen) in the middle of a write. The rank's fields are then those of the last
    consistent snapshot this reader saw, or the "no heartbeat yet" values if it saw
    none, never the half-written bytes, so a torn file never looks like a fresh
    heartbeat. ``save_request`` (the agent's own field) is always current.
    """

    time: float
    step: int | None
    section: str
    section_timeout: float | None
    section_start: float | None
    save_request: int
    save_ack: int
    save_ok: bool
    pid: int
    stack_signal: int
    beats: int
    torn: bool = False
    finishing: int = FINISHING_NO  # FINISHING_EXIT or FINISHING_DONE: exiting, not hung (see the module's doc)
    finishing_since: float | None = None  # wall time it was marked finishing
    compute: float = 0.0  # seconds between heartbeats spent outside collectives, summed (0: not measured)
    compute_intervals: int = 0  # heartbeat intervals `compute` sums

    @property
    def started(self) -> bool:
        """Whether the rank has written any heartbeat or entered a section."""
        return self.time > 0.0 or self.section_start is not None

    def deadline(self, heartbeat_timeout: float | None) -> float | None:
        """Wall time after which the rank counts as hung, or None for no check.

        Inside a section with a timeout the section's own deadline applies; inside
        one without, ``heartbeat_timeout`` counts from the later of its start and the
        last heartbeat; otherwise from the last heartbeat.
        """
        if self.section_start is not None and self.section_timeout:
            return self.section_start + self.section_timeout
        if heartbeat_timeout is None or not self.started:
            return None
        return max(self.time, self.section_start or 0.0) + heartbeat_timeout


SPIN_RETRIES = 10  # read() attempts that only yield before it starts sleeping
RETRY_SLEEP = 0.0001

_NO_HEARTBEAT = HeartbeatState(
    time=0.0, step=None, section="", section_timeout=None, section_start=None,
    save_request=0, save_ack=0, save_ok=False, pid=0, stack_signal=0, beats=0,
)


def state_from(fields: tuple, finish: tuple = (FINISHING_NO, 0.0), pace: tuple = (0.0, 0)) -> HeartbeatState:
    (_, _, _, pid, stack_signal, beat_time, step, sec_timeout, sec_start, request, ack, ok, name_len, name,
     beats) = fields
    finishing, finishing_since = finish
    return HeartbeatState(
        time=beat_time,
        step=None if step < 0 else step,
        section=name[: min(name_len, SECTION_MAX)].decode("utf-8", "replace"),
        section_timeout=sec_timeout or None,
        section_start=sec_start or None,
        save_request=request,
        save_ack=ack,
        save_ok=bool(ok),
        pid=pid,
        stack_signal=stack_signal,
        beats=beats,
        finishing=finishing,
        finishing_since=finishing_since or None,
        compute=pace[0],
        compute_intervals=pace[1],
    )


class HeartbeatFile:
    """Access to one heartbeat file: the agent creates and reads it, the rank writes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._last_good: HeartbeatState | None = None  # what a torn read falls back to

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self) -> HeartbeatFile:
        """(Re)initialise the file: zeroed fields, no heartbeat yet. Called before each spawn.

        Existing mappings (the agent's) stay valid and see the reset.
        """
        buf = bytearray(SIZE)
        HEADER.pack_into(buf, 0, MAGIC, VERSION)
        BEAT.pack_into(buf, OFF_BEAT, 0.0, -1)
        # in place (one pwrite), so that a reader that already mapped the file sees the reset
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != SIZE:
                os.ftruncate(fd, SIZE)
            os.pwrite(fd, bytes(buf), 0)
        finally:
            os.close(fd)
        self.close()
        self._last_good = None  # a new incarnation: the previous one's state is no fallback
        return self

    def open(self) -> HeartbeatFile:
        """Map the file (idempotent); raises HeartbeatFileError if it is not a heartbeat file."""
        if self._map is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise HeartbeatFileError(f"cannot open heartbeat file {self.path}: {exc}") from exc
        try:
            if os.fstat(fd).st_size < SIZE:
                raise HeartbeatFileError(f"heartbeat file {self.path} is smaller than {SIZE} bytes")
            mapping = mmap.mmap(fd, SIZE)
        except BaseException:
            os.close(fd)
            raise
        magic, version = HEADER.unpack_from(mapping, 0)
        if magic != MAGIC or version != VERSION:
            mapping.close()
            os.close(fd)
            raise HeartbeatFileError(f"{self.path} is not a version {VERSION} heartbeat file")
        self._fd, self._map = fd, mapping
        return self

    def close(self) -> None:
        """Unmap the file; safe to call twice."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HeartbeatFile:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped bytes (for the rank-side writer in ``taskd.worker``)."""
        return self.open()._map  # type: ignore[return-value]

    # -- agent side --------------------------------------------------------------------------
    def read(self, retries: int = 100) -> HeartbeatState:
        """A consistent snapshot, retrying while the rank is in the middle of a write.

        The first ``SPIN_RETRIES`` attempts only yield; the rest sleep ~0.1 ms each, so a
        writer that was preempted mid-write gets several milliseconds to finish. After
        ``retries`` attempts the snapshot is reported torn (see ``HeartbeatState.torn``).
        """
        mapping = self.buffer
        for attempt in range(max(1, retries)):
            fields = ALL.unpack_from(mapping, 0)
            finish = FINISH.unpack_from(mapping, OFF_FINISH)
            pace = COMPUTE.unpack_from(mapping, OFF_COMPUTE)
            seq = fields[2]
            if seq % 2 == 0 and SEQ.unpack_from(mapping, OFF_SEQ)[0] == seq:
                state = state_from(fields, finish, pace)
                self._last_good = state
                return state
            time.sleep(0 if attempt < SPIN_RETRIES else RETRY_SLEEP)
        request = REQUEST.unpack_from(mapping, OFF_REQUEST)[0]
        fallback = self._last_good or _NO_HEARTBEAT
        return fallback._replace(save_request=request, torn=True)

    def request_save(self) -> int:
        """Ask the rank to save at its next step boundary; returns the request number to wait for.

        The request is done when ``read().save_ack >= number``; ``save_ok`` then tells whether it worked.
        """
        mapping = self.buffer
        number = REQUEST.unpack_from(mapping, OFF_REQUEST)[0] + 1
        REQUEST.pack_into(mapping, OFF_REQUEST, number)
        return number

    def continue_asked(self) -> float | None:
        """The monotonic time the rank was continued after a stop, while it waits for the agent's word; else None."""
        value = CONTINUE.unpack_from(self.buffer, OFF_CONTINUE)[0]
        return -value if value < 0 else None

    def answer_continue(self, asked_at: float) -> None:
        """The controller still counted this node's agent as the holder when asked at monotonic `asked_at`."""
        CONTINUE.pack_into(self.buffer, OFF_CONTINUE, asked_at)

    def wait_save(self, number: int, timeout: float, interval: float = 0.01) -> HeartbeatState | None:
        """Wait until request ``number`` is acknowledged; None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.read()
            if state.save_ack >= number:
                return state
            if time.monotonic() >= deadline:
                return None
            time.sleep(interval)
