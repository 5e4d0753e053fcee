"""The node's side of in-memory snapshots: the job's directory in /dev/shm, owned, bounded and removed here.

The ranks write their snapshots (`taskd.worker.snapshot`) into segments under one directory per job and node,
``/dev/shm/taskd-snap-<job>-*``, which this area creates before any rank starts and hands to every rank
(TASKD_SNAPSHOT_DIR) with its share of the job's cap (TASKD_SNAPSHOT_BYTES). The directory outlives every rank
(a restarted rank restores from it) and is removed when the launcher closes; it records its owner like a run
directory (`taskd.process.run_dir`), so a new agent on the node removes those whose agent was SIGKILLed.

The cap, per job and node: `taskd run --snapshot-memory`, else TASKD_SNAPSHOT_MEMORY in its environment
(bytes, or a K/M/G suffix; 0 turns snapshots off), by default half of /dev/shm's size. It bounds everything the
job holds there on this node: the ranks' own segments and, on several nodes, the copies of the peer node's ranks
the agent receives as their buddy (`SnapshotArea.wards`, enforced by `agent/snapshots/peer.py`'s `PeerService`).

With a persist directory (`taskd run --snapshot-persist-dir`) the area also runs the node's `Persister`, which
copies the ranks' snapshots there every N steps and once more when the job ends on the node, and hands the
directory to the ranks (TASKD_SNAPSHOT_PERSIST_DIR): their restore falls back to it when memory holds none.
Under msrun (whose command line is not taskd's) the same settings come from their variables (`Persistence.from_env`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from taskd.launcher.snapshot_persist import Persister
from taskd.process.run_dir import make_run_dir, sweep_stale_run_dirs
from taskd.settings import env_text, setting
from taskd.worker.env import Var
from taskd.worker.snapshot_files import BUDDY_KEEP

log = logging.getLogger(__name__)

SHM = "/dev/shm"
_RANK_KEEP = 2  # `Snapshots`' default keep: what the split of the cap between ranks and wards assumes
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_memory(raw: str) -> int:
    """Bytes in ``raw`` ("2G", "512M", "1000"); ValueError naming the variable otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", raw, re.IGNORECASE)
    if match is None:
        raise ValueError(f"{Var.TASKD_SNAPSHOT_MEMORY}={raw!r}: expected bytes, e.g. 2G, 512M or 1000000")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def is_memory(raw: object) -> bool:
    """Whether ``raw`` is what `parse_memory` takes (the configs check it where they are built)."""
    try:
        return isinstance(raw, str) and parse_memory(raw) >= 0
    except ValueError:
        return False


@dataclass(frozen=True)
class Persistence:
    """Where and how often the node's snapshots are persisted (`taskd run --snapshot-persist-*`)."""

    directory: str
    every: int
    keep: int

    def __post_init__(self) -> None:
        if not self.directory or self.every < 1 or self.keep < 1:
            raise ValueError(f"snapshot persistence needs a directory, every >= 1 and keep >= 1, got {self!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Persistence | None:
        """msrun's way (its command line is not taskd's): TASKD_SNAPSHOT_PERSIST_DIR, ..._EVERY, ..._KEEP, read
        through the settings table (`taskd/settings.py`: names, defaults, bounds); None without a directory.
        ValueError naming the variable for a bad value."""
        directory = env_text("snapshot_persist_dir", environ)
        if not directory:
            return None
        numbers = []
        for name in ("snapshot_persist_every", "snapshot_persist_keep"):
            s, raw = setting(name), env_text(name, environ)
            try:
                value = int(raw) if raw else s.default
            except ValueError:
                raise ValueError(f"{s.env}={raw!r}: must be an integer") from None
            if s.bound is not None and not s.bound.allows(value):
                raise ValueError(f"{s.env}={raw!r}: must be {s.bound.rule}")
            numbers.append(value)
        return cls(directory, *numbers)


class SnapshotArea:
    """The job's snapshot directory on this node (or none, with the reason logged once). The launcher makes it
    first thing, before anything it would have to undo: a bad TASKD_SNAPSHOT_MEMORY raises here. ``memory``
    (`taskd run --snapshot-memory`) goes before the variable; ``persist``: see the module's doc. ``nodes``: the
    job's node count (more than one: the agent pushes each rank's newest segment to a buddy node).

    ``pins``: how many of a rank's segments the agent's copiers may hold at once besides the rank's own, each by a
    hard link while it reads it (`snapshot_persist._Pins`, `replication._pinned`): one for the push to the buddy,
    one for the persister. A rank never writes into a held segment (`Snapshots._pinned`): its next save takes a fresh
    one, so its share of the cap must hold ``keep`` + 1 + ``pins`` segments (TASKD_SNAPSHOT_PINS tells it).

    ``wards``: on several nodes, the part of the cap kept for the copies this node's agent receives from its peer
    node (`BUDDY_KEEP` per rank, plus the one being received), so that the node's total for the job stays within the
    cap; the ranks share the rest. Split as the segments are counted, for a peer node like this one (as many ranks,
    as large a state) whose ranks keep the default two: (2 + 1) of (2 + 1 + ``pins`` + 2 + 1) parts."""

    def __init__(self, name: str, nproc_per_node: int, environ: Mapping[str, str] | None = None,
                 root: str = SHM, memory: str | None = None, persist: Persistence | None = None,
                 nodes: int = 1) -> None:
        env = os.environ if environ is None else environ
        raw = (memory if memory is not None else env_text("snapshot_memory", env)).strip()
        self.path: str | None = None
        self.root = root
        self.cap = self.share = self.wards = 0
        self.pins = int(nodes > 1) + int(persist is not None)
        self.persist_dir = os.path.abspath(persist.directory) if persist is not None else None
        self.persister: Persister | None = None
        if not os.path.isdir(root):
            log.warning("snapshots off: %s does not exist; ranks fall back to their disk checkpoints", root)
            return
        st = os.statvfs(root)
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        cap = parse_memory(raw) if raw else size // 2
        if cap == 0:
            log.info("snapshots off (%s=0); ranks fall back to their disk checkpoints", Var.TASKD_SNAPSHOT_MEMORY)
            return
        if cap > free:
            log.warning("%s=%d is more than the %d bytes free in %s: snapshots get at most what is free, and a rank "
                        "that finds it full falls back to its disk checkpoints", Var.TASKD_SNAPSHOT_MEMORY, cap,
                        free, root)
        self.cap = cap
        if nodes > 1:
            ward_parts = BUDDY_KEEP + 1
            self.wards = cap * ward_parts // (_RANK_KEEP + 1 + self.pins + ward_parts)
        self.share = (cap - self.wards) // max(1, nproc_per_node)
        self.path = make_run_dir(f"snap-{name}", root)  # first removes the directories of agents that died
        if persist is not None and self.persist_dir is not None:
            try:
                self.persister = Persister(self.path, self.persist_dir, nproc_per_node, persist.every, persist.keep,
                                           _slow_disk(env))
            except (OSError, ValueError) as exc:  # nothing of the job's stays behind: its directory goes too
                shutil.rmtree(self.path, ignore_errors=True)
                self.path = None
                raise ValueError(f"--snapshot-persist-dir {persist.directory}: {exc}") from exc

    def env(self) -> dict[str, str]:
        """What each rank is given: the directory, its share of the cap and the pins it leaves room for, and the
        persisted copies'."""
        persisted = {Var.TASKD_SNAPSHOT_PERSIST_DIR: self.persist_dir} if self.persist_dir else {}
        if self.path is None:
            return persisted
        return {Var.TASKD_SNAPSHOT_DIR: self.path, Var.TASKD_SNAPSHOT_BYTES: str(self.share),
                Var.TASKD_SNAPSHOT_PINS: str(self.pins), **persisted}

    def held_bytes(self) -> int:
        """Host memory the job's snapshots hold on this node now."""
        total = 0
        for folder, _dirs, files in os.walk(self.path or "/nonexistent"):
            for name in files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except FileNotFoundError:
                    continue
        return total

    def close(self) -> None:
        """Remove the directory and everything in it (the job has ended on this node), and those of agents that
        died on this host (a whole `taskd run` SIGKILLed, replaced by a standby started before it died: no agent
        starts after it to sweep them, and the job would end leaving them); idempotent."""
        if self.persister is not None:
            self.persister.close()
            self.persister = None
        if self.path is None:
            return
        held = self.held_bytes()
        shutil.rmtree(self.path, ignore_errors=True)
        log.info("removed the job's snapshots from %s (%.1f MB held)", self.path, held / 1e6)
        self.path = None
        sweep_stale_run_dirs(self.root)  # it says what it removed


def _slow_disk(env: Mapping[str, str]) -> Callable[[], None] | None:
    """TASKD_SNAPSHOT_PERSIST_FAULT=slow-disk:SECONDS (tests): each persisted copy's fsync waits that long first."""
    raw = env.get(Var.TASKD_SNAPSHOT_PERSIST_FAULT, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"slow-disk:(\d+(?:\.\d+)?)", raw)
    if match is None:
        raise ValueError(f"{Var.TASKD_SNAPSHOT_PERSIST_FAULT}={raw!r}: expected slow-disk:SECONDS")
    seconds = float(match.group(1))
    return lambda: time.sleep(seconds)


__all__ = ["SHM", "Persistence", "SnapshotArea", "parse_memory"]
