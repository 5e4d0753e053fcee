"""A rank's TORCHELASTIC_ERROR_FILE: what torch's ``@record`` wrote when the rank's main raised.

torch (torch/distributed/elastic/multiprocessing/errors/error_handler.py, ``record_exception``)
writes ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": ..., "timestamp": "<epoch s>"}}}``;
a newer form has ``"message"`` as a plain string. Either becomes a :class:`RankError`, which the
agent shows first, as the root cause, when the rank fails.

The file lives in the launcher's private run directory, not in a shared --log-dir: the rank
writes it with ``open(path, "w")``, which would follow a symlink planted there.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_ERROR_FILE = 1024 * 1024  # a traceback is kilobytes; never read a huge or hostile file whole


@dataclass(frozen=True)
class RankError:
    """The root cause a rank recorded: ``exception`` ("ValueError: bad"), its traceback, when (epoch s)."""

    exception: str
    traceback: str
    timestamp: float | None
    path: str

    def lines(self) -> list[str]:
        """For the console and the job summary: the exception first, then the traceback."""
        return [self.exception, *self.traceback.rstrip("\n").splitlines()]


def read_error_file(path: str) -> RankError | None:
    """The error a rank recorded in ``path``; None when it wrote none (or nothing readable, logged).

    Opened with O_NOFOLLOW: a symlink in its place is not followed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read the error file %s: %s", path, exc.strerror or exc)
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_ERROR_FILE + 1)
    if not raw.strip():
        return None  # the rank died while @record was writing, or wrote nothing
    try:
        if len(raw) > MAX_ERROR_FILE:
            raise ValueError(f"larger than {MAX_ERROR_FILE} bytes")
        data = json.loads(raw.decode("utf-8", "replace"))
        return _parse(data, path)
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("error file %s is not torch's format (%s); ignoring it", path, exc)
        return None


def _parse(data: object, path: str) -> RankError:
    if not isinstance(data, dict) or "message" not in data:
        raise ValueError('no "message" field')
    message = data["message"]
    if isinstance(message, str):  # torch's newer form: the message alone
        return RankError(message, "", _timestamp(data.get("timestamp")), path)
    if not isinstance(message, dict):
        raise ValueError('"message" is neither a string nor an object')
    extra = message.get("extraInfo") or {}
    if not isinstance(extra, dict):
        extra = {}
    return RankError(str(message.get("message", "")), str(extra.get("py_callstack", "")),
                     _timestamp(extra.get("timestamp")), path)


def _timestamp(value: object) -> float | None:
    try:
        return float(value) if value is not None else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
