"""msrun's per-rank logs (`<log_dir>/worker_<rank>.log`), kept across restarts.

msrun reopens a restarted rank's log with "w", which would erase the traceback of the fault that
caused the restart: before each start after the first, the previous incarnation's log is kept as
`worker_<rank>.log.<n>`. taskd's own launcher appends to its logs itself and needs none of this.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("taskd.agent")


class MsrunLogs:
    """Where msrun writes each rank's output, and the rotation that keeps earlier incarnations'."""

    def __init__(self, log_dir: str | None, enabled: bool) -> None:
        self.log_dir = log_dir if enabled else None
        self._starts: dict[int, int] = {}

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
                except OSError as exc:
                    log.warning("cannot keep %s: %s", path, exc)
