"""Reaping a rank's process the moment it ends, and the orphans it left (the launcher's mechanics, apart from
its callbacks): no zombie stays behind, and no signal can reach a group whose number was reused."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from taskd.launcher.incarnation import Incarnation
from taskd.launcher.orphans import OrphanKeeper
from taskd.process.exitcodes import describe_returncode
from taskd.process.spawn import has_exited, kill_group, wait_exit

log = logging.getLogger(__name__)


class Reaper:
    """Reaps incarnations and sweeps orphans for one launcher; ``closed()`` says when its close() took over."""

    def __init__(self, lock: threading.RLock, orphans: OrphanKeeper, closed: Callable[[], bool]) -> None:
        self._lock = lock
        self._orphans = orphans
        self._closed = closed

    def reap(self, inc: Incarnation) -> bool:
        """If the incarnation's process has exited: kill what is left of its group, reap it. True if it ended.

        The group is killed *before* reaping, while the leader's zombie still
        reserves the pgid, so the signal cannot hit an unrelated group.
        """
        if not inc.running:
            return True
        pid = inc.pid
        assert pid is not None and inc.popen is not None
        if not has_exited(pid):
            return False
        kill_group(pid)  # processes the rank left in its group
        inc.returncode = inc.popen.wait()  # a zombie by now (has_exited above): returns at once
        log.info("rank %d (pid %d) %s", inc.global_rank, pid, describe_returncode(inc.returncode))
        if self._orphans.active and not self._closed():  # close() deals with orphans itself, with a grace
            self._orphans.sweep(signal.SIGKILL)
        return True

    def wait(self, inc: Incarnation, timeout: float) -> None:
        """Wait (up to ``timeout``) for a signalled incarnation to end, then reap it."""
        if inc.running:
            wait_exit(inc.pid, timeout)  # type: ignore[arg-type]
            self.reap(inc)

    def sweep_exited_orphans(self) -> None:
        """I/O thread tick: reap orphans that died by themselves, so no zombie accumulates."""
        with self._lock:
            if self._orphans.active and not self._closed():
                self._orphans.sweep(None)
