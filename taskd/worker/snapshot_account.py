"""Where a rank's restore came from, told to its agent: files beside the ranks' folders in the snapshot directory.

Two small JSON files per rank, in the job's snapshot directory (``TASKD_SNAPSHOT_DIR``), never under
``rank<R>/`` (whose names a rank's `Snapshots` owns and a buddy copies):

- ``rank<R>.fetched``: written by a replacement's agent when it fetched the lost node's copy from its buddy
  (`taskd.agent.replication`): the steps it fetched, the nodes involved and how far the lost rank had got (its
  newest step as the lost node's agent last reported it to the controller: the buddy's copy lags it, and ranks of
  scope "rank" share no cut whose other ranks could tell). A rank's restore of one of those
  steps is then from "buddy", not from its own node's memory; it takes the file (removes it) as it restores, so
  a later restart of the same rank restores from the node's memory again, and says so. With no steps and a
  ``why``: the replacement's agent found no copy (the lost node's buddy lost too, or none held one), so the rank's
  fallback to disk says that, not a guess.
- ``rank<R>.restored``: written by the rank's restore (`Snapshots.restore`, `LiveGroup`): its pid, the source
  ("memory": the node's own, "buddy", "persisted", "disk" or "none"), the step restored and the newest step the
  rank held in memory before it, or, a lost node's rank, had reached (the steps past the restored one are
  redone). The agent reads it when it sees training resume (`taskd.agent.ranks.resumption`) and puts it in its
  console line and its report to the controller.

Standard library only: a rank imports it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, replace

log = logging.getLogger(__name__)

SOURCES = ("memory", "buddy", "persisted", "disk", "none")


@dataclass(frozen=True)
class Fetched:
    """A lost node's copy, fetched from its buddy: ``node`` is the lost node, ``holder`` the node that held it
    (-1: none); ``why``, when nothing was fetched, says why (both copies lost)."""

    node: int
    holder: int
    steps: tuple[int, ...]
    why: str = ""
    newest: int = -1  # the newest step the lost rank had published, as its node's agent last reported (-1: unknown)


@dataclass(frozen=True)
class Restored:
    """One rank's restore: ``newest`` is the newest step it held in memory before it (-1: none)."""

    rank: int
    pid: int
    source: str
    step: int
    newest: int = -1
    holder: int = -1  # the node whose agent held the copy, for "buddy"
    at: float = 0.0  # when (wall clock): a record from before a round's fault is an earlier round's

    @property
    def redone(self) -> int | None:
        """Steps past the one restored that this rank had in memory: redone (None: it held none)."""
        return max(0, self.newest - self.step) if self.newest >= 0 and self.step >= 0 else None


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _read(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def mark_fetched(directory: str, rank: int, fetched: Fetched) -> None:
    """The agent's side: rank ``rank``'s segments of ``fetched.steps`` came from the buddy."""
    _write(os.path.join(directory, f"rank{rank}.fetched"), asdict(fetched))


def take_fetched(directory: str, rank: int) -> Fetched | None:
    """The rank's side, at its restore: what its agent fetched for it, if anything (the file is removed)."""
    path = os.path.join(directory, f"rank{rank}.fetched")
    data = _read(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        return None if data is None else Fetched(int(data["node"]), int(data["holder"]),
                                                 tuple(int(s) for s in data["steps"]), str(data.get("why", "")),
                                                 int(data.get("newest", -1)))
    except (KeyError, TypeError, ValueError):
        return None


def write_restored(directory: str | None, restored: Restored) -> None:
    """The rank's side: say where its restore came from (nothing without a snapshot directory)."""
    if not directory:
        return
    try:
        _write(os.path.join(directory, f"rank{restored.rank}.restored"),
               asdict(replace(restored, at=restored.at or time.time())))
    except OSError as exc:  # the directory went with the job: nobody is left to read it
        log.debug("rank %d: restore not recorded: %s", restored.rank, exc)


def read_restored(directory: str | None, rank: int) -> Restored | None:
    """The agent's side: rank ``rank``'s last restore, None when it recorded none."""
    data = _read(os.path.join(directory, f"rank{rank}.restored")) if directory else None
    try:
        kinds = {"source": str, "at": float}
        return None if data is None else Restored(**{k: kinds.get(k, int)(v) for k, v in data.items()})
    except (TypeError, ValueError):
        return None


__all__ = ["SOURCES", "Fetched", "Restored", "mark_fetched", "read_restored", "take_fetched", "write_restored"]
