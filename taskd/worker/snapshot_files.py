"""What a folder of snapshot segments holds, read from its names: the one reader every snapshot folder uses.

Three kinds of folder share one layout, ``<root>/rank<R>/s<step:012d>.snap`` (a step's segment under its published
name): a rank's own in /dev/shm (`taskd.worker.snapshot`), the agent's persisted copies (`snapshot_persist`) and a
buddy's received copies (`taskd.agent.snapshots.copies`). Anything else in a rank folder (a free segment, a copy
being written, one set aside as ``.corrupt``) is no published step. Reading the names here, and nowhere else,
keeps the three from disagreeing on what a folder holds.

Standard library only: a rank imports it.
"""

from __future__ import annotations

import os
import re

BUDDY_KEEP = 2
"""Copies a buddy keeps per rank of a ward (its peer node): the newest two received (a cut across nodes needs the
step before the newest). Here, not in the agent, because the launcher's cap split counts them too."""

_STEP = re.compile(r"s(\d{12})\.snap")
_RANK = re.compile(r"rank(\d+)")


def segment_name(step: int) -> str:
    """A step's published name."""
    return f"s{step:012d}.snap"


def step_of(name: str, suffix: str = "") -> int | None:
    """The step ``name`` publishes (with ``suffix``: the step of a segment set aside under that suffix), else None."""
    if suffix:
        if not name.endswith(suffix):
            return None
        name = name[:-len(suffix)]
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def steps_in(folder: str, below: int | None = None, suffix: str = "") -> set[int]:
    """The steps whose segment lies in ``folder`` under its published name (only those older than ``below``, when
    given; with ``suffix``, those set aside under it); none when the folder is missing. One listdir."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return set()
    steps = {s for s in (step_of(n, suffix) for n in names) if s is not None}
    return steps if below is None else {s for s in steps if s < below}


def rank_folders(root: str) -> dict[int, str]:
    """The ``rank<R>`` folders under ``root``, by global rank."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {}
    return {int(m.group(1)): os.path.join(root, m.group(0)) for m in map(_RANK.fullmatch, names) if m}


def held(root: str) -> dict[int, set[int]]:
    """Each rank folder's published steps under ``root``: one listdir of it and one of each rank's folder."""
    return {rank: steps_in(folder) for rank, folder in rank_folders(root).items()}


def common_cut(held: dict[int, set[int]]) -> tuple[int | None, str]:
    """The newest step every rank holds (one node: each rank reads every rank's folder, ``held``), or why none."""
    common = set.intersection(*held.values()) if held else set()
    if common:
        return max(common), ""
    empty = [r for r, steps in held.items() if not steps]
    if empty:
        return None, f"rank(s) {', '.join(map(str, empty))} hold no snapshot"
    newest = ", ".join(f"rank {r}: {max(s)}" for r, s in held.items())
    return None, f"no step is held by every rank (newest {newest})"


__all__ = ["BUDDY_KEEP", "common_cut", "held", "rank_folders", "segment_name", "step_of", "steps_in"]
