"""msrun's per-rank logs (`<log_dir>/worker_<rank>.log`), kept across restarts.

msrun reopens a restarted rank's log with "w", which would erase the traceback of the fault that
caused the restart: before each start after the first, the previous incarnation's log is kept as
`worker_<rank>.log.<n>`. taskd's own launcher appends to its logs itself and needs none of this.

Each incarnation's log ends with one taskd line giving its wall-clock start and end (appended once
the rank is gone: msrun's worker writes through its own file offset, so nothing may be written to a
live rank's log), from which the downtime of a recovery can be read.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("taskd.agent")


class MsrunLogs:
    """Where msrun writes each rank's output, and the rotation that keeps earlier incarnations'."""

    def __init__(self, log_dir: str | None, enabled: bool) -> None:
        self.log_dir = log_dir if enabled else None
        self._starts: dict[int, int] = {}
        self._started_at: dict[int, tuple[int, float]] = {}  # local rank -> (global rank, wall-clock start)

    def worker_log(self, global_rank: int) -> str | None:
        if not self.log_dir:
            return None
        return os.path.join(self.log_dir, f"worker_{global_rank}.log")

    def before_start(self, ranks: dict[int, int]) -> None:
        """Keep the logs of the ranks about to start again ({local rank: global rank})."""
        for local_rank, global_rank in ranks.items():
            path = self.worker_log(global_rank)
            if path is None:
                return
            starts = self._starts.get(local_rank, 0)
            self._starts[local_rank] = starts + 1
            if starts and os.path.exists(path):
                kept = f"{path}.{starts - 1}"
                try:
                    os.replace(path, kept)
                    log.debug("kept the log of rank %d's incarnation %d as %s", local_rank, starts - 1, kept)
                    self._close_incarnation(local_rank, kept, "restarted")
                except OSError as exc:
                    log.warning("cannot keep %s: %s", path, exc)
            self._started_at[local_rank] = (global_rank, time.time())

    def finish(self) -> None:
        """The job ended and every rank is gone: close the last incarnation's log of each rank."""
        for local_rank, (global_rank, _) in list(self._started_at.items()):
            path = self.worker_log(global_rank)
            if path is not None and os.path.exists(path):
                self._close_incarnation(local_rank, path, "job ended")
        self._started_at.clear()

    def _close_incarnation(self, local_rank: int, path: str, why: str) -> None:
        """Append the incarnation's wall-clock start and end to its (dead) rank's log."""
        started = self._started_at.get(local_rank)
        if started is None:
            return
        global_rank, at = started
        number = self._starts.get(local_rank, 1) - (2 if why == "restarted" else 1)
        line = (f"==== taskd: rank {global_rank} (local {local_rank}) start #{number} at {wall_clock(at)}, "
                f"{why} at {wall_clock(time.time())} ====\n")
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            log.debug("cannot close %s: %s", path, exc)


def wall_clock(when: float) -> str:
    """ISO 8601 local time with milliseconds and the UTC offset: 2026-11-30T20:50:09.123+0000."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when)) + f".{int(when % 1 * 1000):03d}" + \
        time.strftime("%z", time.localtime(when))
