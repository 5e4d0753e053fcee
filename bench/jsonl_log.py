"""A logging handler that appends each record as one JSON line with its exact creation time.

The drivers (`run_taskd.py`, `run_torchrun.py`) attach it so the benchmarks can timestamp the
agents' own log lines ("fault: ...", "Worker group FAILED ...") to the microsecond.
"""

from __future__ import annotations

import json
import logging
import os


class JsonlHandler(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.DEBUG)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps({"t": record.created, "name": record.name, "level": record.levelname,
                               "msg": record.getMessage()})
            os.write(self._fd, (line + "\n").encode())
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
        super().close()


def attach(logger_name: str, env_var: str = "BENCH_EVENTS", level: int = logging.INFO) -> None:
    """Attach a JsonlHandler writing to $env_var (if set) to `logger_name`."""
    path = os.environ.get(env_var)
    if not path:
        return
    logger = logging.getLogger(logger_name)
    logger.addHandler(JsonlHandler(path))
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
