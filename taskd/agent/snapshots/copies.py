"""Snapshot segments as files an agent copies: what a node has published, and a copy received, checked, kept.

The ranks of a node publish ``<dir>/rank<R>/s<step>.snap`` (`taskd.worker.snapshot`). This module reads those
(the newest step every local rank published, each segment in chunks) and writes received copies under a root
laid out the same way: ``<dir>/peer/node<N>/rank<R>/`` for a buddy's copy of node N, or the node's own
``<dir>/rank<R>/`` for a replacement restoring a lost node's. A copy is written under a name no reader takes
(``.in-*``), checked against its header (step, rank, CRC-32 of the body; a segment the rank reused while it was
read fails here) and only then renamed to its step's name, so a restorable name always holds an intact segment.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping

from taskd.worker.snapshot_files import BUDDY_KEEP, held, rank_folders, segment_name, steps_in
from taskd.worker.snapshot_segment import CHUNK, HEADER_SIZE, SnapshotError, crc32, read_header

KEEP = BUDDY_KEEP
"""Copies a buddy keeps per rank: the newest two received (a cut across nodes needs the step before the newest)."""


def to_push(root: str) -> dict[int, int]:
    """The step of each rank under ``root`` its buddy's copy should hold next (`plan` of what they hold)."""
    return plan(held(root))


def plan(ranks: Mapping[int, set[int]]) -> dict[int, int]:
    """The step of each rank its buddy's copy should hold next, from each rank's published steps: the newest step
    every rank published (a consistent cut, scope "job"), else each rank's own newest. Ranks that never exchange
    state (scope "rank") drift apart under load by more than the two steps a rank keeps, leaving no common step:
    the copy must follow each rank's newest then, or it stops where they last agreed. {} while any rank has
    published nothing."""
    if not ranks or not all(ranks.values()):
        return {}
    common = set.intersection(*ranks.values())
    return {rank: max(common) if common else max(steps) for rank, steps in ranks.items()}


class Incoming:
    """One segment being received into ``root``/rank<R>/: written, checked, then published under its step's name."""

    def __init__(self, root: str, rank: int, step: int) -> None:
        self.folder = os.path.join(root, f"rank{rank}")
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.rank, self.step = rank, step
        self.path = os.path.join(self.folder, f".in-{step}-{os.urandom(3).hex()}")
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in finish/abandon

    def write(self, data: bytes) -> None:
        self._fh.write(data)

    def finish(self, keep: int | None = KEEP) -> None:
        """`verify`, then `publish`: SnapshotError, and nothing published, when the copy is not intact."""
        self.verify()
        self.publish(keep)

    def verify(self) -> None:
        """Close the copy and check it (SnapshotError, the copy gone, when it is not the intact segment)."""
        self._fh.close()
        try:
            check(self.path, self.step, self.rank)
        except (SnapshotError, OSError):
            self.abandon()
            raise

    def publish(self, keep: int | None = KEEP) -> None:
        """Rename the verified copy to its step's name; then keep the newest ``keep`` received, dropping any newer
        step (left by a run the fault ended)."""
        os.replace(self.path, os.path.join(self.folder, segment_name(self.step)))
        if keep is None:
            return
        steps = sorted(steps_in(self.folder))
        stale = [s for s in steps if s > self.step] + [s for s in steps if s <= self.step][:-keep]
        for s in stale:
            _unlink(os.path.join(self.folder, segment_name(s)))

    def abandon(self) -> None:
        self._fh.close()
        _unlink(self.path)


def check(path: str, step: int, rank: int) -> None:
    """SnapshotError unless ``path`` is the complete, intact segment of ``step`` of ``rank``."""
    with open(path, "rb") as fh:
        header = read_header(fh.read(HEADER_SIZE), path)
        if (header.step, header.rank) != (step, rank):
            raise SnapshotError(f"{path}: holds step {header.step} of rank {header.rank}, not {step} of {rank}")
        crc, left = 0, header.length
        while left > 0 and (chunk := fh.read(min(CHUNK, left))):
            crc = crc32(chunk, crc)
            left -= len(chunk)
    if left or crc != header.crc:
        raise SnapshotError(f"{path}: {'truncated' if left else 'checksum mismatch'} (the rank reused it while "
                            "it was copied?)")


def copies(root: str) -> Iterator[tuple[int, int, str]]:
    """(rank, step, path) of every published segment under ``root``, oldest step first."""
    for rank, folder in sorted(rank_folders(root).items()):
        for step in sorted(steps_in(folder)):
            yield rank, step, os.path.join(folder, segment_name(step))


def pin(root: str, into: str) -> list[tuple[int, int, str]]:
    """Hard links to every published segment under ``root``, made under ``into`` (laid out the same): (rank, step,
    link) of each, oldest step first. A received copy is never written in place (a new file, renamed), so what a
    link holds stays that copy whatever replaces or prunes its name meanwhile; `remove` ``into`` when done."""
    pinned = []
    for rank, step, path in copies(root):
        folder = os.path.join(into, f"rank{rank}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        link = os.path.join(folder, segment_name(step))
        try:
            os.link(path, link)
        except FileNotFoundError:  # pruned between the listing and the link (a caller not holding the lock)
            continue
        pinned.append((rank, step, link))
    return pinned


def held_bytes(root: str) -> int:
    """Bytes the copies under ``root`` hold: each file once however many links pin it (a fetch's), the copies being
    received left out (`_receiving` counts them as they arrive)."""
    sizes: dict[int, int] = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if name.startswith(".in-"):
                continue
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


def remove(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["CHUNK", "HEADER_SIZE", "KEEP", "Incoming", "check", "copies", "held_bytes", "pin", "plan",
           "segment_name", "to_push"]
