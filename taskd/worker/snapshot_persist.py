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
from collections.abc import Callable
from dataclasses import dataclass

from taskd.worker.checkpoint import fsync_dir, pid_alive_elsewhere, unlink_if_present
from taskd.worker.snapshot_ballot import ballot, outvoted
from taskd.worker.snapshot_files import segment_name, steps_in
from taskd.worker.snapshot_segment import CHUNK, HEADER_SIZE, SnapshotError, crc32, load, read_header

_TEMP = re.compile(r"\.s\d+\.(\d+)\.[0-9a-f]+\.tmp")
CORRUPT = ".corrupt"


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


@dataclass(frozen=True)
class PersistedCut:
    """The step every rank restores from the persisted copies (None: none), and the newer steps passed over and why
    (every rank's copy of the step taken was verified, so no rank falls back alone)."""

    step: int | None
    passed: tuple[str, ...] = ()

    def words(self) -> str:
        return "; ".join(self.passed)


def verify(path: str, step: int, rank: int) -> str:
    """Why the copy at ``path`` is not the intact snapshot of ``step`` of ``rank`` ('' when it is): the check its
    load makes (header, length, checksum of the whole body), so the format's own code decides."""
    try:
        load(path, step, rank, use=_discard)
    except (SnapshotError, OSError) as exc:
        return str(exc)
    return ""


def _discard(_state: object) -> None:
    return None


def cut(root: str, world: int, agree: Callable[[set[int]], set[int]] | None = None, own: int = 0) -> PersistedCut:
    """The newest step whose copy every rank of ``world`` has whole and intact under ``root``: the same step on every
    rank, a copy that fails its check set aside (``*.corrupt``) and the next older step tried. Without ``agree``
    (the ranks of one node, which all see ``root``) each rank checks every rank's copy of a step, so all reach the
    same answer without talking; with ``agree`` (a job on several nodes) each checks its own (``own``) and the
    ranks agree, twice per step tried: on the step, then on whether every copy of it passed."""
    if agree is not None:
        return _agreed_cut(root, agree, own)
    folders = [os.path.join(root, f"rank{r}") for r in range(world)]
    held = [steps_in(f) for f in folders]
    passed: dict[int, list[str]] = {}  # step -> what was wrong with its copies
    chosen = None
    for step in sorted(set.intersection(*held) if held else set(), reverse=True):
        order = [own] + [r for r in range(world) if r != own]  # its own first: its load then reads a cached file
        paths = {r: os.path.join(folders[r], segment_name(step)) for r in order}
        incomplete = [r for r in order if not complete(paths[r], step, r)]
        damaged = {} if incomplete else {r: why for r in order if (why := verify(paths[r], step, r))}
        if not incomplete and not damaged:
            chosen = step
            break
        for r in damaged:
            quarantine(paths[r])
        passed[step] = ([f"rank {r}'s copy is incomplete" for r in incomplete]
                        + [f"rank {r}'s copy fails its check ({why})" for r, why in damaged.items()])
    told = set(passed)
    for r, folder in enumerate(folders):  # copies a sibling rank set aside before this one looked
        for step in steps_in(folder, suffix=CORRUPT):
            if (chosen is None or step > chosen) and step not in told:
                passed.setdefault(step, []).append(f"rank {r}'s copy was set aside as damaged")
    return PersistedCut(chosen, tuple(f"step {step}: {said}" for step in sorted(passed, reverse=True)
                                      for said in passed[step]))


def _agreed_cut(root: str, agree: Callable[[set[int]], set[int]], own: int) -> PersistedCut:
    """Across nodes: the ranks taking part in ``agree`` now (after a scale-in, fewer than the job started with),
    never a count of them taken from the start: each votes for the step only when its own copy of it passed."""
    folder = os.path.join(root, f"rank{own}")
    mine = {s for s in steps_in(folder) if complete(os.path.join(folder, segment_name(s)), s, own)}
    passed: list[str] = []
    while common := agree(mine):
        step = max(common)
        path = os.path.join(folder, segment_name(step))
        why = verify(path, step, own)
        if why:
            quarantine(path)
        voted = agree(ballot(not why, step, own))
        if step in voted:  # every rank's copy of it passed
            return PersistedCut(step, tuple(passed))
        passed.append(f"step {step}: rank {own}'s copy fails its check ({why})" if why else
                      outvoted(step, voted, "copy"))
        mine = {s for s in mine if s < step}
    return PersistedCut(None, tuple(passed))


def own_newest(root: str, of_rank: int) -> int | None:
    """Scope "rank": this rank's own newest whole persisted copy."""
    folder = os.path.join(root, f"rank{of_rank}")
    for step in sorted(steps_in(folder), reverse=True):
        if complete(os.path.join(folder, segment_name(step)), step, of_rank):
            return step
    return None


def quarantine(path: str) -> None:
    """Set a damaged copy aside (``*.corrupt``, kept for inspection) so that no later cut picks it."""
    try:
        os.replace(path, path + CORRUPT)
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
                crc = crc32(chunk, crc)
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


__all__ = ["PersistedCut", "complete", "cut", "own_newest", "prune", "publish", "quarantine", "remove_stale_temps",
           "verify", "write_copy"]
