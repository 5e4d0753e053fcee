"""Is the state file's write-ahead log whole? Read before SQLite opens the file.

SQLite applies a `-wal` file's frames up to the first one whose salt or checksum does not match, and
drops every frame after it without a word; its next checkpoint then overwrites the evidence. A commit
SQLite would drop is a change the controller answered 0 for: starting on it would bring jobs back
without it (or not at all, and their agents re-create them with a fresh restart budget). So the frames
are checked here first, as SQLite's `walIndexRecover` reads them (https://sqlite.org/fileformat.html,
"The Write-Ahead Log"), and a log that would lose a commit is refused with what to do.

What is normal and passes: no log or an empty one, a log with only its header, a torn tail (the last
transaction, never committed, cut short by a crash), and frames of an older generation after the
current ones (a log SQLite reset and reused: their salt differs).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

WAL_HEADER = 32
FRAME_HEADER = 24
MAGIC = (0x377F0682, 0x377F0683)  # checksums in little-endian / big-endian words
VERSION = 3007000


@dataclass(frozen=True)
class WalProblem:
    """Why a log does not apply: `lost` commits SQLite would drop, from frame `first_bad` (1-based) of `frames`."""

    why: str
    frames: int
    lost: int
    first_bad: int


def _checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum over `data` (a multiple of 8 bytes), continued from (s0, s1)."""
    words = struct.unpack((">" if big_endian else "<") + f"{len(data) // 4}I", data)
    mask = 0xFFFFFFFF
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & mask
        s1 = (s1 + words[i + 1] + s0) & mask
    return s0, s1


def check_wal(path: str) -> WalProblem | None:
    """None when SQLite would apply every committed frame of `path` (or there is none); else what it would drop."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) <= WAL_HEADER:
        return None  # no frame: nothing to lose
    magic, version, page_size, _seq, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:WAL_HEADER])
    frame_size = FRAME_HEADER + page_size
    frames = (len(data) - WAL_HEADER) // frame_size
    if magic not in MAGIC or version != VERSION or page_size < 512 or page_size & (page_size - 1):
        return WalProblem("its header is not a SQLite write-ahead log header", frames, frames, 1)
    big = magic & 1 == 1
    s0, s1 = _checksum(data[:24], big)
    if (s0, s1) != (c1, c2):
        return WalProblem("its header fails its checksum", frames, frames, 1)
    first_bad = 0
    lost = 0
    for i in range(frames):
        at = WAL_HEADER + i * frame_size
        header = data[at:at + FRAME_HEADER]
        _page, commit_size, f_salt1, f_salt2, f1, f2 = struct.unpack(">6I", header)
        if (f_salt1, f_salt2) != (salt1, salt2):
            break  # an older generation's frame: the current log ends here
        if not first_bad:
            s0, s1 = _checksum(header[:8], big, s0, s1)
            s0, s1 = _checksum(data[at + FRAME_HEADER:at + frame_size], big, s0, s1)
            if (s0, s1) != (f1, f2):
                first_bad = i + 1
        if first_bad and commit_size:
            lost += 1  # a commit after the break: SQLite drops it
    if not lost:
        return None  # whole, or a torn last transaction that never committed
    return WalProblem(f"frame {first_bad} fails its checksum", frames, lost, first_bad)


def wal_refusal(state_path: str) -> str:
    """"" when the state file's log applies whole; else an error naming the file, what is lost, and what to do."""
    wal = state_path + "-wal"
    problem = check_wal(wal)
    if problem is None:
        return ""
    size = os.path.getsize(wal)
    return (f"the state file's write-ahead log {wal} ({size} bytes, {problem.frames} frames) does not apply: "
            f"{problem.why}, so SQLite would silently drop {problem.lost} committed change(s) from frame "
            f"{problem.first_bad} on; nothing was changed. Keep a copy of {state_path} and {wal}, then either "
            f"restore both from a backup, or move {wal} aside to start from the last checkpoint (the jobs' "
            "changes since then are lost: their agents re-create them)")
