"""The launcher's orphans: rank descendants re-parented to its process while it is a child subreaper.

See docs/launcher.md ("Nothing left behind") for the rules; the mechanics live in
:mod:`taskd.process.subreaper`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from taskd.process.spawn import wait_exit
from taskd.process.subreaper import (
    Orphan,
    acquire_subreaper,
    find_orphans,
    reap_orphan,
    release_subreaper,
    signal_tree,
)

log = logging.getLogger(__name__)

_CREATE_TIME_SLACK = 2.0  # psutil's create_time is only as exact as the boot time (whole seconds)

# What the launcher tells the keeper about its ranks: the pids it holds un-reaped (ranks, spares),
# and, asked only when an orphan exists, the sessions and heartbeat files of its running ranks.
Held = Callable[[], set[int]]
Running = Callable[[], tuple[set[int], set[str]]]


class OrphanKeeper:
    """Finds, kills and reaps orphans; every method but :meth:`acquire` runs under the launcher's lock."""

    def __init__(self, lock: threading.RLock, held: Held, running: Running,
                 watch_exit: Callable[[int, Callable[[], None]], bool], heartbeat_var: str) -> None:
        self._lock = lock
        self._held = held
        self._running = running
        self._watch_exit = watch_exit
        self._heartbeat_var = heartbeat_var
        self._own_sid = os.getsid(0)
        self._since = time.time() - _CREATE_TIME_SLACK  # nothing older can descend from our ranks
        self.active = False

    def acquire(self) -> None:
        self.active = acquire_subreaper()

    def release(self) -> None:
        if self.active:
            release_subreaper()
            self.active = False

    def sweep(self, sig: int | None, everyone: bool = False) -> list[Orphan]:
        """Reap orphans that exited; send ``sig`` (None: none) to the live ones and their descendants.

        Unless ``everyone``, an orphan that still belongs to a running rank is spared:
        it is in that rank's session (it left the group with setpgid) or it inherited
        that rank's heartbeat file variable. An orphan with no such mark cannot be told
        apart after re-parenting and is killed when any rank ends.
        """
        orphans = find_orphans(self._held(), self._own_sid, self._since)
        if not orphans:  # the usual case on a rank's exit path: one small read, nothing more
            return orphans
        sids, heartbeats = self._running()
        for orphan in orphans:
            if orphan.zombie:
                reap_orphan(orphan)
                continue
            if sig is None:
                continue
            if not everyone and (orphan.sid in sids or orphan.env(self._heartbeat_var) in heartbeats):
                continue
            log.info("killing pid %d (%s), left behind by a rank outside its process group",
                     orphan.pid, signal.Signals(sig).name)
            signal_tree(orphan, sig)
            self._watch_exit(orphan.pid, lambda o=orphan: self._reap_locked(o))
        return orphans

    def _reap_locked(self, orphan: Orphan) -> None:
        with self._lock:  # serialised with every other reap, so the pid check in reap_orphan holds
            reap_orphan(orphan)

    def wait_gone(self, orphans: list[Orphan], deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the live ones among ``orphans`` to exit."""
        for orphan in orphans:
            if not orphan.zombie:
                wait_exit(orphan.pid, max(0.0, deadline - time.monotonic()))

    def kill_all(self, timeout: float) -> None:
        """SIGKILL and reap every orphan, again until none is left (an orphan's children become orphans)."""
        deadline = time.monotonic() + timeout
        while True:
            orphans = self.sweep(signal.SIGKILL, everyone=True)
            if not orphans:
                return
            if time.monotonic() >= deadline:
                log.warning("pids %s left behind by ranks did not die within %.0fs",
                            [o.pid for o in orphans], timeout)
                return
            for orphan in orphans:
                if not orphan.zombie:
                    wait_exit(orphan.pid, min(1.0, max(0.0, deadline - time.monotonic())))
                    reap_orphan(orphan)
            time.sleep(0.005)  # an orphan's children are re-parented to us a moment after it dies
