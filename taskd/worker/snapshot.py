"""In-memory snapshots that outlive the rank: a restarted rank restores its newest consistent step without a disk.

    snapshots = worker.Snapshots(fallback=ckpt)     # ckpt: a CheckpointManager, used when no snapshot survives
    state, start = snapshots.restore() or (init_state(), 0)
    for step in range(start, steps):
        state = train_step(state)
        snapshots.save(state, step + 1)             # about one memory copy of the state

Where a snapshot lives: in a segment (a file in /dev/shm) of the job's snapshot directory, which the node's agent
(`taskd run`'s launcher, `taskd.launcher.snapshots`) creates, hands to the ranks (TASKD_SNAPSHOT_DIR), accounts
for and removes when the job ends; a new agent removes the directories of agents that were SIGKILLed. A rank
writes into its own segments (``<dir>/rank<R>/``): ``save`` copies the state into a free segment, its checksum
taken behind the copy, and returns; a background thread writes its header and publishes it by renaming it to its
step's name (``s<step>.snap``), then frees the oldest beyond ``keep``. A rank killed at any moment therefore
leaves its published snapshots intact, and what it was writing unpublished (removed by its next incarnation).

On start ``restore`` finds the consistent cut: the newest step every rank of the job has published (scope
"job"), or this rank's own newest (scope "rank", for ranks that never exchange state). With ``keep`` >= 2 a
data-parallel job always has one: a rank cannot publish step s+2 before every rank has copied step s+1 (the
collectives of step s+2 wait for them), and a rank's save waits for its previous publish.

Standard library only; outside `taskd run` (no TASKD_SNAPSHOT_DIR) ``save`` does nothing and ``restore`` goes
straight to the fallback.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from taskd.worker import snapshot_files as files
from taskd.worker import snapshot_persist as persisted
from taskd.worker.env import Var, env_int, rank, restart_count, world_size
from taskd.worker.snapshot_account import Fetched, Restored, take_fetched, write_restored
from taskd.worker.snapshot_ballot import cut_answer, cut_offer
from taskd.worker.snapshot_segment import SnapshotError, flatten, load, populate, seal, write_body
from taskd.worker.snapshot_vote import InUse, Outvoted, Unagreed, Vote, guarded, load_voted

log = logging.getLogger(__name__)

SCOPES = ("job", "rank")
PUBLISH_WAIT = 60.0
"""How long a save (or restore) waits for the previous snapshot's publish (a checksum of the state: well under a
second for gigabytes); past it SnapshotError, since a publish that takes that long is stuck."""
DEFAULT_EVERY = 10
"""The adapters' default snapshot interval in steps (`SnapshotCallback(every=...)` of Hugging Face, Lightning and
MindSpore, the examples' --snapshot-every): the smallest k <= 10 whose CPU cost per step, measured against no
snapshots, stays within 3 % (BENCHMARKS.md, issue 33: bench/snapshot_save_cpu.py). A fault redoes at most k steps."""
_ROUND = 1 << 16  # segments grow in 64 KiB steps, so that a state whose small objects vary keeps its segment


class Fallback(Protocol):
    """What ``restore`` falls back to: a `CheckpointManager` (anything with ``load_latest``)."""

    def load_latest(self) -> tuple[Any, int] | None: ...


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _round(size: int) -> int:
    return -(-size // _ROUND) * _ROUND


class _Segment:
    """One file of the rank's, mapped once and reused: a later snapshot of the same size copies into pages that
    are already there instead of faulting in fresh ones."""

    def __init__(self, path: str, free_path: str, step: int | None = None) -> None:
        self.path = path
        self.free_path = free_path  # its name while free or being written: never a published name
        self.step = step  # the step it holds under its published name; None: free (or being written)
        self._fd = -1
        self._map: mmap.mmap | None = None
        self.capacity = 0

    def view(self, size: int) -> memoryview:
        """A writable view of at least ``size`` bytes; SnapshotError when /dev/shm has no room for it."""
        need = _round(size)
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self.capacity = os.fstat(self._fd).st_size
        if not need <= self.capacity <= 2 * need:  # grow, or give back what a much smaller state does not use
            self._unmap()
            os.ftruncate(self._fd, need)
            try:
                os.posix_fallocate(self._fd, 0, need)  # the room is taken now: no SIGBUS in the middle of a copy
            except OSError as exc:
                os.ftruncate(self._fd, 0)
                self.capacity = 0
                if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    st = os.statvfs(os.path.dirname(self.path))
                    raise SnapshotError(f"{os.path.dirname(os.path.dirname(self.path))} is full: a snapshot of "
                                        f"{_mb(need)} does not fit in the {_mb(st.f_bavail * st.f_frsize)} left "
                                        f"of its {_mb(st.f_blocks * st.f_frsize)}") from exc
                raise
            self.capacity = need
        if self._map is None:
            self._map = mmap.mmap(self._fd, self.capacity)
            populate(self._map, write=True)  # every page at once (fallocate took the room), not a fault each
        return memoryview(self._map)

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def close(self) -> None:
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Snapshots:
    """A rank's snapshots in the node's memory, and their restore (see the module's doc).

    ``keep``: published snapshots kept (at least 2 for scope "job"); the rank holds at most ``keep`` + 1 segments
    (one being written), and the agent's copiers up to ``pins`` more (segments the rank let go while the push to the
    buddy or the persister held a link to them: never written again, so a save takes a fresh one rather than wait;
    TASKD_SNAPSHOT_PINS), all of which must fit in its share of the job's cap (TASKD_SNAPSHOT_BYTES). ``scope``: "job"
    restores the newest step every rank holds; "rank" this rank's own newest (ranks that exchange no state).
    ``fallback``: what ``restore`` returns when no snapshot can be restored (a `CheckpointManager`), said in
    the log. ``background``: publish (header, rename, the oldest freed) on a thread; ``save`` costs the copy and
    its checksum. ``directory``, ``cap`` and ``pins`` default to the agent's variables.
    """

    def __init__(self, keep: int = 2, scope: str = "job", fallback: Fallback | None = None, *,
                 directory: str | None = None, cap: int | None = None, background: bool = True,
                 agree: Callable[[set[int]], set[int]] | None = None, persist_dir: str | None = None,
                 pins: int | None = None) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        lowest = 2 if scope == "job" else 1
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < lowest:
            raise ValueError(f"keep must be an integer >= {lowest} for scope {scope!r} (the consistent cut needs the "
                             f"step before the newest while the newest is written), got {keep!r}")
        self.keep, self.scope, self.fallback, self.background = keep, scope, fallback, background
        self.agree = agree  # a job on several nodes: the steps every rank holds, from this rank's (a collective)
        self.directory = directory if directory is not None else os.environ.get(Var.TASKD_SNAPSHOT_DIR) or None
        self.cap = cap if cap is not None else env_int(Var.TASKD_SNAPSHOT_BYTES)
        self.pins = pins if pins is not None else env_int(Var.TASKD_SNAPSHOT_PINS, 0) or 0
        if not isinstance(self.pins, int) or isinstance(self.pins, bool) or self.pins < 0:
            raise ValueError(f"pins must be an integer >= 0, got {self.pins!r}")
        self.rank, self.world = rank(), world_size()
        self.restored_from: str | None = None  # "memory", "buddy", "persisted", "disk" or None, once restore() ran
        self.persist_dir = persist_dir if persist_dir is not None else \
            os.environ.get(Var.TASKD_SNAPSHOT_PERSIST_DIR) or None
        self.off: str | None = None  # why snapshots are off (the reason was logged), None while they are on
        self._segments: list[_Segment] = []
        self._pool: ThreadPoolExecutor | None = None  # one publisher thread for the rank's life: no start per save
        self._pending: Future[None] | None = None
        self._fault = _fault_step(self.rank)
        if self.directory is None:
            self.off = "no snapshot directory (TASKD_SNAPSHOT_DIR): the script was not started by `taskd run`"
            return
        self._own = os.path.join(self.directory, f"rank{self.rank}")
        os.makedirs(self._own, mode=0o700, exist_ok=True)
        self._adopt()

    # -- save ------------------------------------------------------------------------------------------------
    def save(self, state: Any, step: int) -> bool:
        """Copy ``state`` (a tree of numpy arrays, tensors with an adapter, small objects) as the snapshot of
        ``step``; returns once it is copied (published in the background), True, or False when snapshots are off.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        if self.off is not None:
            return False
        self.wait()
        flat = flatten(state)
        need = (self.keep + 1 + self.pins) * _round(flat.size)
        if self.cap is not None and need > self.cap:
            held = f" plus {self.pins} the agent may still be copying (to the buddy node, to disk)" if self.pins else ""
            self._turn_off(f"the snapshot of step {step} is {_mb(flat.size)}, and {self.keep} kept plus one being "
                           f"written{held} need {_mb(need)}, above this rank's share of the job's snapshot memory, "
                           f"{_mb(self.cap)} ({Var.TASKD_SNAPSHOT_MEMORY} of `taskd run`, split over the node's ranks)")
            return False
        segment = self._free_segment()
        try:
            view = segment.view(flat.size)
        except (SnapshotError, OSError) as exc:
            self._turn_off(str(exc))
            return False
        try:
            length, crc = write_body(view, flat, self._injected_fault(step, len(flat.buffers)))
        except BaseException:
            view.release()
            raise
        args = (segment, view, step, length, len(flat.skeleton), len(flat.buffers), crc)
        if self.background:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskd-snapshot")
            self._pending = self._pool.submit(self._publish, *args)
        else:
            self._publish(*args)
        return True

    def _publish(self, segment: _Segment, view: memoryview, step: int, length: int, skeleton: int,
                 count: int, crc: int) -> None:
        try:
            seal(view, step, self.rank, self.world, length, skeleton, count, crc)
            view.release()
            final = os.path.join(self._own, files.segment_name(step))
            replaced = [s for s in self._segments if s.step == step and s is not segment]
            os.replace(segment.path, final)  # published: complete and checksummed, or not there at all
            segment.path, segment.step = final, step
            for old in replaced:  # a step saved again (after a restore): its old file is gone, its memory too
                old.close()
                self._segments.remove(old)
            published = sorted((s for s in self._segments if s.step is not None), key=lambda s: s.step or 0)
            for old in published[:-self.keep]:
                self._free(old)
        except OSError as exc:  # e.g. the agent removed the directory: the job is ending
            view.release()
            log.warning("snapshot of step %d not published: %s", step, exc)

    def _free(self, segment: _Segment) -> None:
        os.replace(segment.path, segment.free_path)
        segment.path, segment.step = segment.free_path, None

    def _new_segment(self, path: str | None = None, step: int | None = None) -> _Segment:
        free = os.path.join(self._own, f".free-{len(self._segments)}-{os.urandom(3).hex()}")
        segment = _Segment(path or free, free, step)
        self._segments.append(segment)
        return segment

    def _free_segment(self) -> _Segment:
        for segment in [s for s in self._segments if s.step is None]:
            if not self._pinned(segment):
                return segment
        if len(self._segments) > self.keep:  # more published than kept (adopted from a restart): reuse the oldest
            oldest = min(self._segments, key=lambda s: s.step or 0)
            self._free(oldest)
            if not self._pinned(oldest):
                return oldest
        return self._new_segment()

    def _pinned(self, segment: _Segment) -> bool:
        """Whether the agent holds a link to the free ``segment`` (it is copying it to disk,
        `taskd.launcher.snapshot_persist`): then it is never written again; this rank lets its own name go and
        takes another, and the agent's link keeps the copy's bytes until it is done."""
        try:
            linked = os.stat(segment.path).st_nlink > 1
        except FileNotFoundError:
            linked = True  # gone from under us: not reusable either
        if linked:
            segment.remove()
            self._segments.remove(segment)
        return linked

    def _injected_fault(self, step: int, count: int) -> Callable[[int], None] | None:
        if self._fault != step or restart_count() != 0:
            return None

        def kill(i: int) -> None:
            if i == count // 2:
                log.warning("TASKD_SNAPSHOT_FAULT: SIGKILL inside the copy of step %d", step)
                os.kill(os.getpid(), signal.SIGKILL)
        return kill

    def wait(self, timeout: float = PUBLISH_WAIT) -> None:
        """Wait for the snapshot being published; SnapshotError past ``timeout``."""
        pending = self._pending
        if pending is None:
            return
        try:
            pending.result(timeout)
        except FutureTimeout:
            raise SnapshotError(f"the previous snapshot is still being published after {timeout} s") from None
        self._pending = None

    # -- restore ---------------------------------------------------------------------------------------------
    def restore(self, use: Callable[[Any], Any] | None = None, *, agreed: bool = False) -> tuple[Any, int] | None:
        """``(state, step)`` of the newest consistent snapshot in memory, else of the agent's persisted copies
        (TASKD_SNAPSHOT_PERSIST_DIR), else what the fallback loads (its newest checkpoint), else None; the log
        says which, and ``restored_from`` is "memory" (this node's), "buddy" (a lost node's copy its replacement
        fetched from the buddy), "persisted", "disk" or None; the agent is told too (`snapshot_account`).

        With ``use``: ``(use(state), step)``, the state from memory being views of the mapped segment, valid
        only inside ``use`` (which copies what it keeps: one copy instead of two; see `load`). An error of ``use`` is
        raised as it is, never taken for a damaged snapshot (no fallback loaded over a half-applied state).
        ``agreed``: the cut comes from ``agree`` (a collective) on one node too: ranks that are running (a live
        group's rollback) may still be publishing, so what the node's directories show is not yet the same for all."""
        self.wait()
        why, damaged, persists = self.off, False, self.persist_dir is not None
        fetched = take_fetched(self.directory, self.rank) if self.directory else None
        newest = max(self._published(self.rank), default=-1) if why is None else -1
        if fetched is not None:  # a lost node's rank: it had got this far, past the buddy's copy (steps redone)
            newest = max(newest, fetched.newest)
        passed: list[str] = []  # newer steps every rank passed over: a copy of one failed its check
        vote = Vote(self.agree, self.rank, self.world, self._nodes(), self.directory or "", self.scope == "rank")
        step: int | None = None
        while self.off is None or self._collective(agreed):  # an off rank takes part, holding nothing
            step, why, persists = self._cut(agreed, step)
            if step is None:
                if fetched is not None and fetched.why and not passed:  # what the agent knows, not a guess
                    why = f"node {fetched.node} was lost with its snapshots, and {fetched.why}"
                break
            started = time.perf_counter()
            try:
                state, size = load_voted(vote, os.path.join(self._own, files.segment_name(step)), step, use)
            except InUse as exc:  # the caller's own error, not a damaged snapshot: no fallback over it
                raise exc.__cause__ from None  # type: ignore[misc]
            except Outvoted as exc:
                passed.append(str(exc))
                continue
            except Unagreed as exc:  # several nodes and no vote: this rank alone knows (the old fallback)
                why, damaged = f"rank {self.rank}'s snapshot of step {step} cannot be agreed on: {exc}", True
                break
            self._drop_after(step)
            buddy = fetched is not None and step in fetched.steps
            self.restored_from = "buddy" if buddy else "memory"
            self._account(step, newest, fetched if buddy else None)
            where = (f"node {fetched.node}'s copy, fetched from node {fetched.holder}'s agent"
                     if buddy and fetched is not None else "this node's memory")
            log.log(logging.WARNING if passed else logging.INFO, "rank %d restored step %d from memory: %s (%s in "
                    "%.3f s, the vote included)%s", self.rank, step, where, _mb(size), time.perf_counter() - started,
                    _passed_words(passed, vote.alone))
            return state, step
        why = f"{why}{_passed_words(passed, vote.alone)}"
        if persists and not damaged:  # across nodes: every rank has persisted copies (the cut said), or none looks
            found, unpersisted = self._restore_persisted(use, why, agreed)  # no cut in memory (alike on every rank)
            if found is not None:
                self._account(found[1], newest, None)
                return found
            why = f"{why}; {unpersisted}"
        elif self.persist_dir is not None and not damaged:  # the cut said: a rank of the job has no persisted copies
            why = f"{why}; not every rank has persisted copies ({Var.TASKD_SNAPSHOT_PERSIST_DIR}): none tried"
        if self.fallback is None:
            log.info("rank %d: no snapshot restored (%s)", self.rank, why)
            self._account(-1, newest, None)
            return None
        found = self.fallback.load_latest()
        if found is not None and use is not None:
            found = use(found[0]), found[1]
        self._drop_after(found[1] if found else -1)
        self.restored_from = "disk" if found else None
        self._account(found[1] if found else -1, newest, None)
        level = logging.WARNING if found and self.directory else logging.INFO  # a fresh start is no news
        log.log(level, "rank %d: no snapshot in memory to restore (%s): falling back to %s: %s", self.rank, why,
                self._fallback_words(), f"step {found[1]}" if found else "none there, starting afresh")
        return found

    def _account(self, step: int, newest: int, fetched: Fetched | None) -> None:
        """Tell the agent where this restore came from (`snapshot_account`): its console and the round's account."""
        write_restored(self.directory, Restored(self.rank, os.getpid(), self.restored_from or "none", step, newest,
                                                fetched.holder if fetched is not None else -1))

    def _restore_persisted(self, use: Callable[[Any], Any] | None, why: str,
                           agreed: bool = False) -> tuple[tuple[Any, int] | None, str]:
        """The newest step every rank has whole and intact in the agent's persisted copies
        (TASKD_SNAPSHOT_PERSIST_DIR), said in one line, and the newer steps passed over (a copy that fails its check
        on any rank: every rank takes the older step, never a mix); (None, why) when there is none."""
        root = self.persist_dir or ""
        multi = self._collective(agreed)
        try:
            found = persisted.cut(root, self.world, self.agree if multi else None, self.rank) \
                if self.scope == "job" else persisted.PersistedCut(persisted.own_newest(root, self.rank))
        except SnapshotError as exc:
            log.warning("rank %d: the persisted snapshots in %s cannot be agreed on: %s", self.rank, root, exc)
            return None, f"the persisted snapshots in {root} cannot be agreed on: {exc}"
        passed = f"; newer persisted steps passed over on every rank: {found.words()}" if found.passed else ""
        step = found.step
        if step is None:
            return None, f"no step persisted in {root} that every rank can restore{passed}"
        path = os.path.join(root, f"rank{self.rank}", files.segment_name(step))
        started = time.perf_counter()
        try:
            state, size = load(path, step, self.rank, guarded(use))
        except InUse as exc:
            raise exc.__cause__ from None  # type: ignore[misc]
        except (SnapshotError, OSError) as exc:  # verified a moment ago: changed since (never seen)
            persisted.quarantine(path)
            log.error("rank %d: its persisted snapshot of step %d is damaged, set aside as %s.corrupt: %s", self.rank,
                      step, path, exc)
            return None, f"rank {self.rank}'s persisted snapshot of step {step} is damaged: {exc}"
        self._drop_after(step)
        self.restored_from = "persisted"
        log.warning("rank %d restored step %d from the persisted snapshots in %s (%s in %.3f s): no snapshot in "
                    "memory (%s)%s", self.rank, step, root, _mb(size), time.perf_counter() - started, why, passed)
        return (state, step), ""

    def _collective(self, agreed: bool) -> bool:
        """Whether the cut comes from ``agree``: then every rank of the job calls it equally often (an off one too)."""
        return self.scope == "job" and (self._nodes() > 1 or agreed) and self.agree is not None

    def _cut(self, agreed: bool = False, below: int | None = None) -> tuple[int | None, str, bool]:
        """The step to restore (older than ``below``: newer ones were passed over) and, without one, why; and
        whether to try the persisted copies next (across nodes only when every rank has them: `cut_offer`)."""
        local = self.persist_dir is not None
        if self.scope == "rank":
            own = self._published(self.rank, below)
            return (max(own), "", local) if own else (None, f"rank {self.rank} holds no snapshot", local)
        nodes = self._nodes()
        if nodes > 1 or agreed:  # each node sees its own ranks only (a lost node's, fetched from its buddy, too)
            if self.agree is None:
                return None, (f"the job runs on {nodes} nodes and nothing agrees on a step across them (`agree`: "
                              "TorchSnapshots passes one once torch.distributed is initialized)"), local
            try:
                common, persists = cut_answer(self.agree(cut_offer(
                    self._published(self.rank, below) if self.off is None else set(), local)))
            except SnapshotError as exc:
                return None, str(exc), local
            if self.off is not None or not common:
                return None, self.off or (f"no step is held by every rank of the job ({nodes} node(s); a copy "
                                          "further behind than `keep` steps?)"), persists
            return max(common), "", persists
        return *files.common_cut({r: self._published(r, below) for r in range(self.world)}), local

    @staticmethod
    def _nodes() -> int:
        return env_int(Var.GROUP_WORLD_SIZE, 1) or 1

    def _published(self, of_rank: int, below: int | None = None) -> set[int]:
        return files.steps_in(os.path.join(self.directory or "", f"rank{of_rank}"), below)

    def _drop_after(self, step: int) -> None:
        """Forget this rank's snapshots past the restored step: they belong to the run the fault ended."""
        for segment in [s for s in self._segments if s.step is not None and s.step > step]:
            segment.remove()
            self._segments.remove(segment)

    def _fallback_words(self) -> str:
        where = getattr(self.fallback, "directory", None)
        return f"the disk checkpoints in {where}" if where else f"the fallback's checkpoints ({self.fallback!r})"

    # -- housekeeping ----------------------------------------------------------------------------------------
    def _adopt(self) -> None:
        """Take over the segments an earlier incarnation of this rank left: its published ones stay restorable,
        what it was writing when it died is removed (never restored)."""
        for name in os.listdir(self._own):
            path = os.path.join(self._own, name)
            step = files.step_of(name)
            if step is not None:
                self._new_segment(path, step)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                log.debug("removed %s, left unpublished by an earlier incarnation", path)

    def _turn_off(self, reason: str) -> None:
        self.off = reason
        for segment in self._segments:
            segment.remove()
        self._segments.clear()
        then = self._fallback_words() if self.fallback is not None else "the script's own checkpoints"
        log.error("rank %d: snapshots off: %s; a restart falls back to %s", self.rank, reason, then)

    def close(self) -> None:
        """Wait for the publish in flight and unmap; the segments stay for a restart (the agent removes them)."""
        self.wait()
        for segment in self._segments:
            segment.close()


def _passed_words(passed: list[str], alone: bool) -> str:
    """The newer steps a restore passed over (a copy of each failed its check), for its line."""
    return f"; newer steps passed over{'' if alone else ' on every rank'}: {'; '.join(passed)}" if passed else ""


def _fault_step(of_rank: int) -> int | None:
    """TASKD_SNAPSHOT_FAULT=kill-in-copy:RANK:STEP (tests): the step at which this rank's first incarnation is
    SIGKILLed half-way through copying its snapshot."""
    raw = os.environ.get(Var.TASKD_SNAPSHOT_FAULT, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"kill-in-copy:(\d+):(\d+)", raw)
    if match is None:
        raise ValueError(f"{Var.TASKD_SNAPSHOT_FAULT}={raw!r}: expected kill-in-copy:RANK:STEP")
    return int(match.group(2)) if int(match.group(1)) == of_rank else None


__all__ = ["DEFAULT_EVERY", "SCOPES", "Snapshots", "SnapshotError"]
