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
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"TASKDSN1"
VERSION = 1
_HEADER = struct.Struct("<8sIIqiiQQII")  # magic, version, header size, step, rank, world, body, skeleton, crc, count
HEADER_SIZE = 64
_ENTRY = struct.Struct("<QQ")  # a buffer's offset and length in the body
_ALIGN = 64
_PIECE = 4 << 20  # what a restore reads, then checksums, at a time

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


def write_body(target: memoryview, flat: Flat, between: Callable[[int], None] | None = None) -> int:
    """Copy ``flat`` into ``target`` (the whole segment) after its header; returns the body's length.

    ``between(i)`` runs before buffer i is copied (a test's fault injection: a rank killed inside the copy)."""
    offsets, length = flat.layout
    body = target[HEADER_SIZE:HEADER_SIZE + length]
    table = b"".join(_ENTRY.pack(o, b.nbytes) for o, b in zip(offsets, flat.buffers, strict=True))
    body[:len(table)] = table
    body[len(table):len(table) + len(flat.skeleton)] = flat.skeleton
    for i, (offset, buf) in enumerate(zip(offsets, flat.buffers, strict=True)):
        if between is not None:
            between(i)
        body[offset:offset + buf.nbytes] = buf
    body.release()
    return length


def seal(target: memoryview, step: int, rank: int, world: int, length: int, skeleton: int, count: int) -> None:
    """Checksum the body already in ``target`` (``length`` bytes, ``count`` buffers after a skeleton of
    ``skeleton`` bytes) and write the header: the segment is complete."""
    body = target[HEADER_SIZE:HEADER_SIZE + length]
    crc = zlib.crc32(body)
    body.release()
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


def load(path: str, expect_step: int, expect_rank: int) -> tuple[Any, int]:
    """The state in the segment at ``path`` and its size in bytes; SnapshotError if it is not the complete,
    intact snapshot of that step and rank. Each array is read into memory of its own (never a view of the
    segment, which the rank reuses for a later snapshot), checksummed piece by piece as it is read."""
    with open(path, "rb") as fh:
        header = read_header(fh.read(HEADER_SIZE), path)
        if (header.step, header.rank) != (expect_step, expect_rank):
            raise SnapshotError(f"{path}: holds step {header.step} of rank {header.rank}, "
                                f"not step {expect_step} of rank {expect_rank}")
        reader = _Reader(fh, path)
        head = reader.take(_ENTRY.size * header.count + header.skeleton)
        entries = [_ENTRY.unpack_from(head, i * _ENTRY.size) for i in range(header.count)]
        buffers = []
        for offset, length in entries:
            reader.take(offset - reader.pos)  # the alignment padding: checksummed, not kept
            buffers.append(reader.take(length))
        reader.take(header.length - reader.pos)
    if reader.crc != header.crc:
        raise SnapshotError(f"{path}: checksum mismatch")
    try:
        state = pickle.loads(head[_ENTRY.size * header.count:], buffers=buffers)
    except Exception as exc:
        raise SnapshotError(f"{path}: cannot rebuild the state: {type(exc).__name__}: {exc}") from exc
    return state, HEADER_SIZE + header.length


class _Reader:
    """Reads a segment's body in order into buffers of their own size (memory the allocator can reuse, where
    one buffer of the whole body would be fresh pages, faulted in one by one), keeping the running CRC-32."""

    def __init__(self, fh: Any, path: str) -> None:
        self._fh, self._path = fh, path
        self.pos = self.crc = 0

    def take(self, length: int) -> memoryview:
        if length < 0:
            raise SnapshotError(f"{self._path}: its buffer table is not in order (damaged?)")
        view = memoryview(bytearray(length))
        got = 0
        while got < length:  # checksum each piece while it is still in the cache
            n = self._fh.readinto(view[got:got + _PIECE])
            if not n:
                raise SnapshotError(f"{self._path}: ends {length - got} bytes early (truncated?)")
            self.crc = zlib.crc32(view[got:got + n], self.crc)
            got += n
        self.pos += length
        return view


__all__ = ["HEADER_SIZE", "Flat", "SnapshotError", "flatten", "load", "register_reducer", "seal", "write_body"]
