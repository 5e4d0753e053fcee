"""Where a framework adapter (`hf_snapshot`, `lightning_snapshot`) lays out the checkpoint its trainer resumes from:
a folder per rank on disk (``<base>/taskd-resume/rank<R>/``), never in a memory filesystem, where it would be a
second copy of the whole state outside the snapshots' cap; removed once the trainer has read it. Standard library
only (the unit tier checks it without importing a framework)."""

from __future__ import annotations

import os
import shutil

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def memory_filesystem(path: str, mounts: str = "/proc/self/mounts") -> str | None:
    """The type of the memory filesystem (tmpfs, ramfs) that holds ``path`` (or would, once made), else None (also
    when ``mounts`` cannot be read: nothing known, nothing refused)."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind if kind in MEMORY_FILESYSTEMS else None


def rank_folder(base: str, rank: int) -> str:
    return os.path.join(os.path.abspath(base), "taskd-resume", f"rank{rank}")


def drop(folder: str) -> None:
    """Remove a rank's resume folder, and ``taskd-resume/`` once no rank's folder is left in it."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(folder))
    except OSError:
        pass


__all__ = ["MEMORY_FILESYSTEMS", "drop", "memory_filesystem", "rank_folder"]
