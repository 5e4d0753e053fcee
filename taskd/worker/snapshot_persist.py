"""Snapshots persisted to a directory: the durable copies a job keeps after it ends (issue 33, item 5).

The node's agent (`taskd.launcher.snapshot_persist`) copies the segments its ranks published in /dev/shm to
``<dir>/rank<R>/s<step>.snap``, the same bytes and layout as in memory (`taskd.worker.snapshot_segment`), so
the ranks read them back with the same code. A copy is written as CheckpointManager writes a checkpoint: to a
temporary file in the same folder (``.s<step>.<pid>.<hex>.tmp``, a name no reader takes), checked against the
segment's own header (step, rank, CRC-32 of the body: a segment its rank reused while it was read fails here),
then fsynced, renamed to its step's name and the folder fsynced. A restorable name therefore always holds an
intact, durable copy; an agent killed in the middle leaves a temporary file, which the next one removes.

Standard library only: the ranks import it to restore (`Snapshots.restore` falls back to it when no snapshot
survives in memory), the agent to write.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable

from taskd.worker.checkpoint import fsync_dir, pid_alive_elsewhere, unlink_if_present
from taskd.worker.snapshot_segment import HEADER_SIZE, SnapshotError, read_header

CHUNK = 1 << 20
_NAME = re.compile(r"s(\d{12})\.snap")
_TEMP = re.compile(r"\.s\d+\.(\d+)\.[0-9a-f]+\.tmp")
_RANK = re.compile(r"rank(\d+)")


def segment_name(step: int) -> str:
    return f"s{step:012d}.snap"


def steps_in(folder: str) -> set[int]:
    """The steps with a segment under its published name in ``folder`` (not yet verified)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return set()
    return {int(m.group(1)) for m in map(_NAME.fullmatch, names) if m}


def rank_folders(root: str) -> dict[int, str]:
    """The ``rank<R>`` folders under ``root``, by global rank."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {}
    return {int(m.group(1)): os.path.join(root, m.group(0)) for m in map(_RANK.fullmatch, names) if m}


def complete(path: str, step: int, rank: int) -> bool:
    """Whether ``path`` looks whole: the header of ``step`` of ``rank`` and every byte it announces (the CRC is
    checked when it is loaded). Cheap, so a rank looks at every rank's file of a step before it picks it."""
    try:
        with open(path, "rb") as fh:
            header = read_header(fh.read(HEADER_SIZE), path)
            size = os.fstat(fh.fileno()).st_size
    except (OSError, SnapshotError):
        return False
    return (header.step, header.rank) == (step, rank) and size == HEADER_SIZE + header.length


def cut(root: str, world: int, agree: Callable[[set[int]], set[int]] | None = None, own: int = 0) -> int | None:
    """The newest step whose file every rank of ``world`` has whole under ``root``; with ``agree`` (a job on
    several nodes, whose folders may not all be visible here) the newest that every rank's ``agree`` holds,
    from this rank's (``own``) steps."""
    if agree is not None:
        folder = os.path.join(root, f"rank{own}")
        mine = {s for s in steps_in(folder) if complete(os.path.join(folder, segment_name(s)), s, own)}
        common = agree(mine)
        return max(common) if common else None
    held = [steps_in(os.path.join(root, f"rank{r}")) for r in range(world)]
    for step in sorted(set.intersection(*held) if held else set(), reverse=True):
        if all(complete(os.path.join(root, f"rank{r}", segment_name(step)), step, r) for r in range(world)):
            return step
    return None


def quarantine(path: str) -> None:
    """Set a damaged copy aside (``*.corrupt``, kept for inspection) so that no later cut picks it."""
    try:
        os.replace(path, path + ".corrupt")
    except OSError:
        pass


def remove_stale_temps(folder: str) -> None:
    """Temporary files of copies whose writer died half-way (a SIGKILLed agent)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        match = _TEMP.fullmatch(name)
        if match and not pid_alive_elsewhere(int(match.group(1))):
            unlink_if_present(os.path.join(folder, name))


def write_copy(source: str, folder: str, rank: int, step: int) -> str:
    """Copy the published segment ``source`` (step ``step`` of ``rank``) into ``folder`` under a temporary
    name and check it; returns the temporary path for `publish`. SnapshotError (nothing left behind) when the
    copy is not the intact segment: its rank reused it meanwhile, or it is gone. No fsync here: every rank's
    segment is copied first (memory to the page cache, before the ranks reuse them), then each is made durable."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = os.path.join(folder, f".s{step}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(source, "rb") as src, open(tmp, "xb") as out:
            head = src.read(HEADER_SIZE)
            header = read_header(head, source)
            if (header.step, header.rank) != (step, rank):
                raise SnapshotError(f"{source}: holds step {header.step} of rank {header.rank}, not {step} of {rank}")
            out.write(head)
            crc, left = 0, header.length
            while left > 0 and (chunk := src.read(min(CHUNK, left))):
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
                left -= len(chunk)
            if left or crc != header.crc:
                raise SnapshotError(f"{source}: {'truncated' if left else 'checksum mismatch'} (its rank reused "
                                    "it while it was copied)")
    except BaseException:
        unlink_if_present(tmp)
        raise
    return tmp


def publish(tmp: str, step: int, before_sync: Callable[[], None] | None = None) -> str:
    """Fsync a checked copy, rename it to its step's name and make the rename durable; returns its path.
    ``before_sync``: tests (a slow disk)."""
    folder = os.path.dirname(tmp)
    final = os.path.join(folder, segment_name(step))
    try:
        if before_sync is not None:
            before_sync()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    except BaseException:
        unlink_if_present(tmp)
        raise
    os.replace(tmp, final)
    fsync_dir(folder)
    return final


def prune(folder: str, newest: int, keep: int) -> None:
    """Keep the ``keep`` newest copies up to ``newest``; drop any newer one (left by a run that went back)."""
    steps = sorted(steps_in(folder))
    stale = [s for s in steps if s > newest] + [s for s in steps if s <= newest][:-keep]
    for step in stale:
        unlink_if_present(os.path.join(folder, segment_name(step)))


__all__ = ["complete", "cut", "prune", "publish", "quarantine", "rank_folders", "remove_stale_temps",
           "segment_name", "steps_in", "write_copy"]
