"""Leaving a broken gloo group so that every peer notices at once (live recovery, torch binding).

A gloo group is a full mesh of TCP connections. When a rank dies, only the ranks that were
exchanging data with it get "Connection closed by peer"; a rank further along the ring waits on a
live connection to a survivor until the collective timeout (30 s and more). The survivor's
connections close only when its ProcessGroupGloo is destroyed, and that does not happen when the
group leaves: the C++ side (gloo work items still queued or blocked on a live peer, the
reducer's futures) and Python frames of the failed step keep it, and a forked DataLoader worker
holds copies of the descriptors. So a rank that leaves shuts its group's connections down
explicitly (``shutdown(SHUT_RDWR)`` acts on the connection whatever holds its descriptor): the
peer's read returns EOF, its collective fails, it leaves and shuts down its own connections,
and the EOF runs along the ring in milliseconds.

Which sockets: the connected TCP sockets that appeared in this process while
``init_process_group`` formed the group (gloo connects its full mesh there), minus any whose
peer is the rendezvous store (``MASTER_ADDR:MASTER_PORT``; the store connection is made before
and must outlive every generation). Each is ``dup``-ed at once, so the shutdown can never reach
a descriptor number that was closed and reused meanwhile. With ``TORCH_GLOO_LAZY_INIT=1`` gloo
connects later and nothing is tracked: leaving then relies on the group being freed.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from taskd.worker.checkpoint import hold_background_saves
from taskd.worker.file_events import FileWatch
from taskd.worker.live import Control, ControlWatch

log = logging.getLogger(__name__)


def _socket_inodes() -> dict[int, int]:
    """{fd: socket inode} of this process's open sockets (Linux /proc; empty elsewhere)."""
    found: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (or the listing's own descriptor)
            continue
        if target.startswith("socket:["):
            found[int(name)] = int(target[8:-1])
    return found


def _store_peers(host: str | None, port: str | None) -> set[tuple[str, int]]:
    """The addresses the rendezvous store may be reached at: its connection is never shut down."""
    if not host or not port:
        return set()
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    return {(info[4][0], int(info[4][1])) for info in infos}


class GroupSockets:
    """The TCP connections of the current group generation, held as duplicates until it is left.

    Thread-safe: the rank's main thread forms and leaves generations, and its `LeaveWatch` ends one when
    the agent says it is broken, while the main thread may be blocked in one of its collectives.
    """

    def __init__(self, store_host: str | None = None, store_port: str | None = None) -> None:
        self._store = _store_peers(store_host, store_port)
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self.generation: int | None = None  # the generation the held connections belong to
        self.on_formed: Callable[[], None] | None = None  # called once a generation's connections are held

    def __len__(self) -> int:
        return len(self._held)

    @contextmanager
    def forming(self, generation: int | None = None) -> Iterator[None]:
        """Wrap ``init_process_group`` of ``generation``: every connected socket it opened is tracked."""
        before = set(_socket_inodes().values())
        try:
            yield
        finally:
            with self._lock:
                for fd, inode in _socket_inodes().items():
                    if inode not in before:
                        self._track(fd, inode)
                self.generation = generation
            if self.on_formed is not None:
                self.on_formed()

    def _track(self, fd: int, inode: int) -> None:
        try:
            dup = os.dup(fd)
        except OSError:
            return
        try:
            if os.fstat(dup).st_ino != inode:  # the number was closed and reused in between: not ours
                raise OSError("reused")
            sock = socket.socket(fileno=dup)  # owns dup from here on
        except OSError:
            os.close(dup)
            return
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                raise OSError("not TCP")
            peer = sock.getpeername()  # a listening socket has none
            if (peer[0], int(peer[1])) in self._store:
                raise OSError("the rendezvous store")
        except OSError:
            sock.close()
            return
        self._held.append(sock)

    def shut_down(self) -> int:
        """End every tracked connection now (peers read EOF) and forget it; the number ended."""
        with self._lock:
            return self._shut_down()

    def end_if(self, control: Control | None) -> int:
        """End the held connections if ``control`` says their generation is over (`Control.ends`); the number."""
        with self._lock:
            if control is None or not self._held or self.generation is None or not control.ends(self.generation):
                return 0
            return self._shut_down()

    def _shut_down(self) -> int:
        if self._held:  # the group is broken (the agent said so, or our own collective failed): a recovery follows
            hold_background_saves()  # and a checkpoint being written in the background waits it out
        ended = 0
        for sock in self._held:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                ended += 1
            except OSError:  # already closed by the peer and reaped
                pass
            sock.close()
        self._held.clear()
        self.generation = None
        return ended

    def release(self) -> None:
        """Forget the tracked connections without ending them (the group was destroyed in order)."""
        with self._lock:
            for sock in self._held:
                sock.close()
            self._held.clear()
            self.generation = None


class LeaveWatch:
    """A daemon thread that ends the group's connections the moment the agent says the group is broken.

    Without it a survivor learns of a dead rank only when the failure reaches it along gloo's ring, one
    rank's leave after another (0.7-0.8 s for the last of 8 ranks); the agent knows within milliseconds of
    the death and writes ``leave`` into the control file (or the next generation). Ending our connections
    fails our own blocked collective at once, whatever the main thread is doing, and the usual recovery
    path (leave, wait for the generation, rejoin) follows.

    The thread sleeps in inotify until the agent replaces the control file (`FileReplaced`), and looks
    again every ``idle`` seconds regardless. A generation formed after the file's last change is checked
    the moment it is formed, by the thread that formed it (`GroupSockets.on_formed`): the agent may have
    said it is over while it formed. (The look every 0.1 s this replaced cost ~1.5 ms of CPU a second per
    rank, ~0.5 % of a 4-rank job on 2 cores: bench/live_overhead.py.)
    Where inotify is missing it polls every ``interval`` (one ``os.stat``): 200 wake-ups a second per rank
    cost 10-18 % of a rank's CPU at 8 ranks on 2 cores (taskd.worker.file_events).
    """

    def __init__(self, path: str, sockets: GroupSockets, interval: float = 0.005, idle: float = 2.0,
                 on_end: Callable[[int, Control], None] | None = None) -> None:
        self._path = path
        self._watch = ControlWatch(path)
        self._sockets = sockets
        self._interval = interval
        self._idle = idle
        self._on_end = on_end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskd-leave-watch", daemon=True)
        sockets.on_formed = self._check

    def start(self) -> LeaveWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        with FileWatch(self._path, self._interval, self._idle) as watch:
            while not self._stop.is_set():
                self._check()
                watch.pause()

    def _check(self) -> None:
        try:
            control = self._watch.latest()
            ended = self._sockets.end_if(control)
        except Exception:  # noqa: BLE001 - the watch must never take the rank down; the ring path remains
            log.debug("leave watch", exc_info=True)
            return
        if ended and self._on_end is not None and control is not None:
            self._on_end(ended, control)


class RetiredGroups:
    """Process groups a rank has left, kept until no work of theirs can still be waiting.

    Freeing a ProcessGroupGloo joins its worker threads, and a thread still holding work of the broken
    step (a send or receive on a connection the shutdown did not end) is held until that work's
    collective timeout. Freed in a recovery, that wait stalls the rank (``destroy_process_group`` of a group
    whose allreduce waited on a live peer took the whole 10 s timeout, measured); freed while the interpreter
    finalizes, after the last step, it held a rank for 20 s and then aborted it (``SIGABRT``, gloo's
    "Timed out waiting 30000ms for send operation to complete" thrown where nothing catches it), and
    the finished job failed. So a left group is held until its timeout has passed (`release_expired`),
    and whatever is still held when training ends is never freed (`keep_past_exit`): the process's
    exit reclaims it without joining anything.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: list[tuple[float, object]] = []  # (when its work has surely ended, the group)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, group: object, timeout: float) -> None:
        """Keep ``group``, left now, for ``timeout`` seconds (its longest collective timeout) and a margin."""
        self.release_expired()
        self._held.append((self._clock() + timeout + 5.0, group))

    def release_expired(self) -> int:
        """Let go of the groups whose work has timed out by now (freeing them no longer waits); the number."""
        now = self._clock()
        keep = [(until, group) for until, group in self._held if until > now]
        released = len(self._held) - len(keep)
        self._held = keep
        return released

    def keep_past_exit(self) -> int:
        """Make the groups still held outlive the interpreter's finalization (one extra reference each)."""
        self.release_expired()
        kept = outlive_exit(group for _, group in self._held)
        self._held.clear()
        return kept


def outlive_exit(groups: Iterable[object]) -> int:
    """Give each group one reference nothing drops, so that the interpreter's finalization never frees it.

    A ProcessGroupGloo freed while the interpreter finalizes joins its worker threads there, and a worker
    that then needs the GIL (to free its last work, which holds Python objects) is ended by CPython
    mid-frame: through gloo's C++ frames that is ``std::terminate``, and the rank aborts (``SIGABRT``,
    "terminate called without an active exception") after its last step. torch 2.13's
    ``DistributedDataParallel`` keeps its group alive past ``destroy_process_group`` (each construction
    adds references that nothing drops), so a DDP script's group is freed exactly then: one plain-torchrun
    job in 30 to 70 failed that way here. A group that is never freed is reclaimed by the process's exit,
    which joins nothing. The number of groups kept."""
    kept = 0
    for group in groups:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
        kept += 1
    return kept


NO_PYTHON_THREADS = frozenset({"gloo_tcp_loop"})
"""Names of threads that never take the GIL, left out of `runnable_threads`: gloo's I/O loop spins while a peer's
data waits for a receive this rank has not posted yet (level-triggered epoll), which held `settle_threads` up to
0.9 s between the steps of a 2-rank job (tests/torch_scripts/settle_after_backward.py)."""


def runnable_threads(ignore: frozenset[str] = NO_PYTHON_THREADS) -> int:
    """How many of this process's threads, other than the caller and those named in ``ignore``, are running or
    waiting for a CPU (state R in /proc/self/task; 0 where there is no /proc)."""
    me = threading.get_native_id()
    count = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as stat:
                name, _, rest = stat.read().partition(b" (")[2].rpartition(b")")
            if rest.split()[0] == b"R" and name.decode(errors="replace") not in ignore:
                count += 1
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return count


def settle_threads(limit: float = 2.0, look: float = 0.02, *, runnable: Callable[[], int] = runnable_threads,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Leave the GIL to the process's other threads until none is runnable at two looks in a row, for at most
    ``limit`` seconds; whether they settled.

    Run at the interpreter's exit, before it finalizes (`settle_at_exit`). A gloo worker frees each work it finished
    itself, and a work made during backward holds a Python object (torch 2.13 stashes a context in the
    thread-local state that every work captures), so the worker takes the GIL to free it. The main thread
    wakes from the last step's allreduce before its worker has done so; a worker that asks for the GIL once
    the interpreter is finalizing is ended by CPython (``pthread_exit``), and that unwinding through a
    ``noexcept`` destructor is ``std::terminate``: the rank aborts after its last step (``SIGABRT``, 5 of 80
    exits of a 2-rank DDP job here, 0 of 80 with a 0.1 s sleep after ``close()``). While this thread sleeps,
    a thread that wants the GIL gets it; one not yet scheduled is runnable, and is waited for.
    """
    deadline = clock() + limit
    quiet = 0
    while quiet < 2:
        if clock() >= deadline:
            return False
        sleep(look)
        quiet = quiet + 1 if runnable() == 0 else 0
    return True


_settle_registered = False


def settle_at_exit() -> None:
    """Run `settle_threads` when the interpreter exits, before it finalizes, whichever way the script ends (after
    ``live.close()``, or with an exception out of a step); registered once per process."""
    global _settle_registered
    if not _settle_registered:
        atexit.register(settle_threads)
        _settle_registered = True


def drop_frames(error: BaseException | None) -> None:
    """Clear the locals of the finished frames in ``error``'s traceback (and the exceptions it chains).

    Those frames (the failed backward, the collective's wrapper) hold tensors, futures and the
    group itself; the traceback's text stays intact for a later report.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def collect() -> None:
    """Free what the dropped wrapper and frames held (DDP's reducer and buckets form reference cycles)."""
    gc.collect()


def freeze_older_objects() -> None:
    """Leave the next `collect()` only the objects made from now on (``gc.freeze()``).

    A rebuild frees the old DDP wrapper with a full collection, and a full collection scans every
    object the process tracks: with torch imported that took 0.26 s on each survivor, between
    leaving the old group and joining the new one, while the replacement waited for them. Called
    just before a wrapper is built, so the wrapper itself, and everything newer, is still collected.
    What existed at that moment and later becomes an unreachable cycle is never freed (``gc.unfreeze()``
    undoes it); under live recovery only, where what exists then is the job's model, optimizer and
    imports.
    """
    gc.freeze()
