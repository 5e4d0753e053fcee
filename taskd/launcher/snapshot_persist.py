"""The agent's side of persisted snapshots: every N steps, the node's newest snapshot copied to a directory.

`taskd run --snapshot-persist-dir DIR --snapshot-persist-every N` (TASKD_SNAPSHOT_PERSIST_DIR, ..._EVERY,
..._KEEP): a thread of the agent looks at the job's snapshot directory in /dev/shm every `TICK`; when every
local rank has published a step at or past the next multiple of N, it copies that step's segments to
``DIR/rank<R>/`` (`taskd.worker.snapshot_persist`: temporary file, checked, fsynced, renamed), then keeps
the newest K per rank. When the job ends on the node it persists the newest step too, before /dev/shm is
emptied. The ranks never wait for it: they only publish to memory, and the thread reads what they published
(at a lower CPU priority). A segment its rank reuses while it is read fails its check and is dropped; the
next tick takes a newer step.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from taskd.worker import snapshot_files as sf
from taskd.worker import snapshot_persist as sp
from taskd.worker.checkpoint import lower_thread_priority, unlink_if_present
from taskd.worker.snapshot_segment import SnapshotError

log = logging.getLogger("taskd.agent.snapshot_persist")  # the agent's console shows its lines

TICK = 0.05  # seconds between two looks for a newly published step (a listdir per local rank)
STOP_WAIT = 60.0
"""How long the job's end waits for a copy in flight (a stalled disk): past it the copy is left unfinished,
a temporary file the next agent removes, and the previous persisted step stays the newest."""
NICENESS = 10
FAILURES_SAID = 5  # copies failed in a row before a warning says so


class Persister:
    """Copies the node's newest consistent snapshot from ``source`` (the job's /dev/shm directory, ``ranks``
    local rank folders) to ``target`` every ``every`` steps, keeping ``keep`` per rank."""

    def __init__(self, source: str, target: str, ranks: int, every: int, keep: int,
                 before_sync: Callable[[], None] | None = None) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"snapshot persistence needs every >= 1 and keep >= 1, got every={every}, keep={keep}")
        self.source, self.target, self.ranks, self.every, self.keep = source, target, ranks, every, keep
        self.before_sync = before_sync  # tests: a slow disk
        os.makedirs(target, exist_ok=True)
        if not os.access(target, os.W_OK | os.X_OK):
            raise PermissionError(f"not writable by this agent (uid {os.getuid()})")
        for folder in sf.rank_folders(target).values():
            sp.remove_stale_temps(folder)
        newest = [max(steps) for steps in sf.held(target).values() if steps]
        self.last = max(newest, default=0)  # a job resumed from these starts past them: the next multiple is new
        self.persisted: list[int] = []
        self.failures = 0  # copies failed in a row
        self._lock = threading.Lock()  # one copy at a time: the thread's, or the job end's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskd-snapshot-persist", daemon=True)
        self._thread.start()
        log.info("snapshots persisted to %s every %d steps (the newest %d kept per rank)", target, every, keep)

    def _held(self) -> set[int] | None:
        """The steps every local rank holds in memory; None until every rank has its folder."""
        held = sf.held(self.source)
        if len(held) < self.ranks:
            return None
        return set.intersection(*held.values())

    def due(self, held: set[int]) -> int | None:
        """The step to persist now: the newest held multiple of N past the last one persisted, else the newest
        held step past that multiple (one the agent did not see in time); None when none is due."""
        if not held:
            return None
        newest = max(held)
        if newest < self.last:  # the ranks went back (a restore older than the last copy): count from there
            self.last = newest
        if newest // self.every <= self.last // self.every:
            return None
        multiples = [s for s in held if s % self.every == 0 and s > self.last]
        return max(multiples) if multiples else newest

    def _run(self) -> None:
        lower_thread_priority(NICENESS, "snapshot persister")
        while not self._stop.wait(TICK):
            held = self._held()
            step = self.due(held) if held is not None else None
            if step is not None:
                self.persist(step)
        held = self._held()  # the job ends on this node: the newest step every rank holds, unless persisted already
        if held and max(held) != self.last:
            self.persist(max(held))

    def persist(self, step: int) -> bool:
        """Copy every local rank's segment of ``step``; True once all are published under ``target``."""
        with self._lock:
            started, temps = time.monotonic(), []
            try:
                with _Pins(self.source, step) as pins:  # all pinned, then all copied, before any fsync
                    for rank, pinned in pins.items():
                        temps.append(sp.write_copy(pinned, os.path.join(self.target, f"rank{rank}"), rank, step))
                size = sum(os.path.getsize(tmp) for tmp in temps)
                for i, tmp in enumerate(temps):
                    sp.prune(os.path.dirname(sp.publish(tmp, step, self.before_sync)), step, self.keep)
                    temps[i] = ""
            except (SnapshotError, OSError) as exc:
                for tmp in filter(None, temps):
                    unlink_if_present(tmp)
                self._failed(step, exc)
                return False
            self.last, self.failures = step, 0
            self.persisted.append(step)
        log.info("persisted the snapshots of step %d (%d ranks, %.1f MB) to %s in %.2f s", step, len(temps),
                 size / 1e6, self.target, time.monotonic() - started)
        return True

    def _failed(self, step: int, exc: Exception) -> None:
        """A reused segment fails now and then (the next tick takes a newer step); every time is worth a line."""
        self.failures += 1
        if self.failures % FAILURES_SAID == 0:
            log.warning("%d snapshot copies to %s failed in a row, the last of step %d: %s (segments reused before "
                        "they were copied: a `keep` of more steps gives the copy more time)", self.failures,
                        self.target, step, exc)
        else:
            log.debug("step %d not persisted: %s", step, exc)

    def close(self) -> None:
        """Stop the thread, which persists the newest step every local rank holds on its way out (the job ends on
        this node: its memory is about to be emptied); the job's end waits `STOP_WAIT` for it in all, a stalled
        disk included (the last copy ran on the caller's thread before, its fsync unbounded)."""
        self._stop.set()
        self._thread.join(timeout=STOP_WAIT)
        if self._thread.is_alive():
            log.error("a snapshot copy to %s is still being written after %g s (a stalled disk?): left "
                      "unfinished; step %d stays the newest persisted", self.target, STOP_WAIT, self.last)


class _Pins:
    """Hard links to every local rank's segment of a step, under ``<source>/.persist/``, held while they are
    copied: a rank never writes into a segment with a link besides its own (`Snapshots._pinned`), so the bytes
    copied are the step's however fast the ranks go on. FileNotFoundError when a rank freed it already."""

    def __init__(self, source: str, step: int) -> None:
        self.folder = os.path.join(source, ".persist")
        self.source, self.step = source, step
        self.links: dict[int, str] = {}

    def __enter__(self) -> dict[int, str]:
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        try:
            for rank, folder in sorted(sf.rank_folders(self.source).items()):
                link = os.path.join(self.folder, f"rank{rank}-{sf.segment_name(self.step)}")
                unlink_if_present(link)
                os.link(os.path.join(folder, sf.segment_name(self.step)), link)
                self.links[rank] = link
        except BaseException:
            self.__exit__()
            raise
        return self.links

    def __exit__(self, *exc: object) -> None:
        for link in self.links.values():
            unlink_if_present(link)


__all__ = ["Persister"]
