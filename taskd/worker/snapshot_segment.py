"""One snapshot in memory: a state tree laid out in a shared-memory segment, checksummed, read back.

The state is pickled (protocol 5) with its large buffers out of band: numpy arrays (and torch tensors, through
the reducer `taskd.worker.torch_snapshot` registers) are not serialized but copied, once, straight into the
segment; only the tree's skeleton and small objects are pickled. So writing a snapshot costs about one memory
copy of the state, and reading it back one copy plus the checksum.

Layout of a segment (a file in the job's directory in /dev/shm, mapped by the rank that writes it):

    [0, 64)        header: magic, version, header size, step, rank, world size, body length, skeleton length,
                   CRC-32 of the body, buffer count; written last, so a segment whose header is zeros is unfinished
    body           buffer table (offset, length per buffer, relative to the body), the pickled skeleton, then
                   every buffer at a 64-byte aligned offset

A segment is only ever published (renamed to its step's name) after its header is in place: a reader never
sees a half-written one under a published name, and the checksum catches anything else.

Why CRC-32 (zlib's), and over the whole body: the checksum is two thirds of a save's CPU and half of a
restore's, so cheaper ones were measured (100 MB, this project's 2-core machine, zlib 1.2.13): ``zlib.adler32``
is no faster here (25-34 ms of CPU against 24-26 ms for ``crc32``, whose braided code is as quick), and weaker
(its sums mod 65521 detect fewer short or structured changes), so it is not used; nor did splitting
the check over 2-4 threads (zlib releases the GIL; the parts' CRCs combine into the whole body's) pay off on 2
shared cores: 30-43 ms of wall time either way, more CPU. Computing the CRC of each piece right after copying
it (cache-hot) saved nothing measurable with zlib's CRC (35-56 ms both ways), whose own cost hid it, but does
with zlib-ng's: 12.7 ms of CPU for the copy and the CRC of 100 MB in 1 MB pieces against 15.9 ms for a copy
and then a CRC over the body (means of 10, sd 0.2 and 0.7; caches evicted before each; 256 KB pieces 14.0,
4 MB 13.5), so
`write_body` does that, in the call (2-3 ms more of it) instead of on the publishing thread. What also paid off is
on restore: the segment is mapped with its pages populated in one call and checksummed in place, then each
buffer copied once (see `load`), instead of read into fresh memory, checksummed, and copied again. And a faster
implementation of the same CRC-32: zlib-ng's (the ``zlib-ng`` package, in the extras that snapshot:
``snapshots``, ``torch``, ``mindspore``, ``examples``; folded with carry-less multiplies on CPUs that have
them) takes 4.7-5.0 ms of CPU per 100 MB where zlib 1.2.13's takes 24 (ISA-L's,
``isal``, 6.4), with the same values, so segments, buddies' copies and persisted copies check either way.
"""

from __future__ import annotations

import io
import logging
import mmap
import os
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"TASKDSN1"
VERSION = 1
_HEADER = struct.Struct("<8sIIqiiQQII")  # magic, version, header size, step, rank, world, body, skeleton, crc, count
HEADER_SIZE = 64
_ENTRY = struct.Struct("<QQ")  # a buffer's offset and length in the body
_ALIGN = 64
CHUNK = 1 << 20
"""The unit a segment is handled in: the copy's piece, checksummed right after it while in the cache (L2 here: 1 MB
a core), and what an agent reads, checks, sends and persists at a time."""
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)

try:  # the same CRC-32 as zlib's (same values: segments and copies read either way), 4-5x less CPU
    from zlib_ng.zlib_ng import crc32
except ImportError:  # zlib-ng comes with the extras that snapshot; without it, zlib's
    from zlib import crc32

log = logging.getLogger(__name__)

Reducer = Callable[[Any], tuple[Any, ...]]
_REDUCERS: dict[type, Reducer] = {}


class SnapshotError(Exception):
    """A snapshot cannot be written or read: no room, a damaged segment, an unsupported object."""


def register_reducer(cls: type, reducer: Reducer) -> None:
    """Pickle instances of ``cls`` (and its subclasses) with ``reducer`` in snapshots: it returns what
    ``__reduce__`` would, ideally with the data as a numpy array so that it goes out of band (one copy, no
    serialization). `taskd.worker.torch_snapshot` registers torch.Tensor this way."""
    _REDUCERS[cls] = reducer


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        for klass in type(obj).__mro__:
            reducer = _REDUCERS.get(klass)
            if reducer is not None:
                return reducer(obj)
        return NotImplemented


@dataclass
class Flat:
    """A state taken apart: its pickled skeleton and its large buffers (views of the state's own memory)."""

    skeleton: bytes
    buffers: list[memoryview]

    @property
    def layout(self) -> tuple[list[int], int]:
        """Each buffer's offset in the body, and the body's length."""
        offset = _ENTRY.size * len(self.buffers) + len(self.skeleton)
        offsets = []
        for buf in self.buffers:
            offset = -(-offset // _ALIGN) * _ALIGN
            offsets.append(offset)
            offset += buf.nbytes
        return offsets, offset

    @property
    def size(self) -> int:
        """Bytes of the whole segment."""
        return HEADER_SIZE + self.layout[1]


def flatten(state: Any) -> Flat:
    """Take ``state`` apart without copying its buffers; raises SnapshotError for what cannot be pickled."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        pickler = _Pickler(out, protocol=5, buffer_callback=buffers.append) if _REDUCERS else \
            pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
        pickler.dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"the state cannot be snapshotted: {type(exc).__name__}: {exc}") from exc
    return Flat(out.getvalue(), [b.raw() for b in buffers])


def write_body(target: memoryview, flat: Flat, between: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Copy ``flat`` into ``target`` (the whole segment) after its header; returns the body's length and its CRC-32.

    The CRC is taken piece by piece right behind the copy, over each piece just written, while it is still in
    the cache: cheaper than a second pass over the whole body once it has left it (see the module's doc).
    ``between(i)`` runs before buffer i is copied (a test's fault injection: a rank killed inside the copy)."""
    offsets, length = flat.layout
    body = target[HEADER_SIZE:HEADER_SIZE + length]
    table = b"".join(_ENTRY.pack(o, b.nbytes) for o, b in zip(offsets, flat.buffers, strict=True))
    body[:len(table)] = table
    body[len(table):len(table) + len(flat.skeleton)] = flat.skeleton
    crc, done = 0, 0
    for i, (offset, buf) in enumerate(zip(offsets, flat.buffers, strict=True)):
        if between is not None:
            between(i)
        crc = crc32(body[done:offset], crc)  # the table, the skeleton, the padding before this buffer
        for start in range(0, buf.nbytes, CHUNK):
            end = min(start + CHUNK, buf.nbytes)
            piece = body[offset + start:offset + end]
            piece[:] = buf[start:end]
            crc = crc32(piece, crc)
        done = offset + buf.nbytes
    crc = crc32(body[done:length], crc)
    body.release()
    return length, crc


def seal(target: memoryview, step: int, rank: int, world: int, length: int, skeleton: int, count: int,
         crc: int) -> None:
    """Write the header of the body already in ``target`` (``length`` bytes whose CRC-32 is ``crc``, ``count``
    buffers after a skeleton of ``skeleton`` bytes): the segment is complete."""
    target[:_HEADER.size] = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, step, rank, world, length, skeleton, crc,
                                         count)


@dataclass(frozen=True)
class Header:
    step: int
    rank: int
    world: int
    length: int
    skeleton: int
    crc: int
    count: int


def read_header(raw: bytes, where: str) -> Header:
    if len(raw) < HEADER_SIZE:
        raise SnapshotError(f"{where}: truncated header ({len(raw)} bytes)")
    magic, version, header_size, step, rank, world, length, skeleton, crc, count = _HEADER.unpack_from(raw)
    if magic != MAGIC or version != VERSION or header_size != HEADER_SIZE:
        raise SnapshotError(f"{where}: not a finished taskd snapshot (version {VERSION})")
    return Header(step, rank, world, length, skeleton, crc, count)


def populate(mapping: mmap.mmap, write: bool) -> None:
    """Map every page of ``mapping`` in one call (``MADV_POPULATE_READ``/``_WRITE``) rather than fault them in one
    by one as a copy or a checksum first touches them: ~12 ms of CPU per 100 MB less to read a segment, ~10 ms to
    write a fresh one. Linux < 5.14 has neither: the pages then fault in as before."""
    try:
        mapping.madvise(_MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ)
    except OSError:
        pass


def load(path: str, expect_step: int, expect_rank: int, use: Callable[[Any], Any] | None = None) -> tuple[Any, int]:
    """The state in the segment at ``path`` and its size in bytes; SnapshotError if it is not the complete,
    intact snapshot of that step and rank.

    The segment is mapped, not read: the checksum runs over the mapped body, all of it, before anything is
    rebuilt. Without ``use`` each buffer is then copied, once, into memory of its own (never a view of the
    segment, which the rank reuses for a later snapshot). With ``use`` the state is rebuilt over views of the
    mapping (private: a write to them never reaches the segment) and ``use(state)`` is returned in its place:
    it must copy what it keeps (`TorchSnapshots` copies straight into the model's parameters: one copy, no
    allocation); the mapping is closed when it returns. Exceptions from ``use`` pass through unchanged."""
    with open(path, "rb") as fh:
        header = read_header(fh.read(HEADER_SIZE), path)
        if (header.step, header.rank) != (expect_step, expect_rank):
            raise SnapshotError(f"{path}: holds step {header.step} of rank {header.rank}, "
                                f"not step {expect_step} of rank {expect_rank}")
        size = os.fstat(fh.fileno()).st_size
        if size < HEADER_SIZE + header.length:
            raise SnapshotError(f"{path}: ends {HEADER_SIZE + header.length - size} bytes early (truncated?)")
        mapping = mmap.mmap(fh.fileno(), HEADER_SIZE + header.length, access=mmap.ACCESS_COPY)
    populate(mapping, write=False)
    whole, done = memoryview(mapping), False
    try:
        body = whole[HEADER_SIZE:]
        if crc32(body) != header.crc:
            raise SnapshotError(f"{path}: checksum mismatch")
        state = _rebuild(body, header, path, copy=use is None)
        result = state if use is None else use(state)
        done = True
        return result, HEADER_SIZE + header.length
    finally:
        state = body = None
        whole.release()
        try:
            mapping.close()
        except BufferError:  # a view is still held (by ``use``, or a traceback): unmapped when it is let go
            if done and use is not None:
                log.warning("%s: a view of the restored snapshot outlives its restore", path)


def _rebuild(body: memoryview, header: Header, path: str, copy: bool) -> Any:
    table = _ENTRY.size * header.count
    if table + header.skeleton > header.length:
        raise SnapshotError(f"{path}: its buffer table does not fit its body (damaged?)")
    buffers, end = [], table + header.skeleton
    for i in range(header.count):
        offset, length = _ENTRY.unpack_from(body, i * _ENTRY.size)
        if offset < end or offset + length > header.length:
            raise SnapshotError(f"{path}: its buffer table is not in order (damaged?)")
        end = offset + length
        piece = body[offset:end]
        if copy:
            own = memoryview(bytearray(length))  # one copy, into memory the segment's reuse cannot touch
            own[:] = piece
            piece = own
        buffers.append(piece)
    try:
        return pickle.loads(body[table:table + header.skeleton], buffers=buffers)
    except Exception as exc:
        raise SnapshotError(f"{path}: cannot rebuild the state: {type(exc).__name__}: {exc}") from exc


__all__ = ["CHUNK", "HEADER_SIZE", "Flat", "SnapshotError", "crc32", "flatten", "load", "populate", "register_reducer",
           "seal", "write_body"]
