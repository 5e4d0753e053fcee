"""The agent -> ranks half of the live-recovery protocol (taskd.worker.live): the node's control file.

The agent replaces it atomically (write, rename) to ask every live rank of the node to leave its group, rejoin
a named generation, retry the step in place or abort; each rank reads it at step boundaries, and its leave
watch and its waits are woken by the rename (inotify, taskd.worker.file_events).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, NamedTuple

from taskd.worker.file_events import FileWatch

log = logging.getLogger(__name__)

DEFAULT_REJOIN_TIMEOUT = 120.0
STORE_PREFIX = "taskd/gen{generation}"  # key prefix of one generation's group in the rendezvous store
ACTIONS = ("rejoin", "retry", "abort", "leave", "migrate", "release")  # the last two: taskd.worker.migration


class LiveProtocolError(ValueError):
    """A control file or value that does not follow the protocol."""


class Control(NamedTuple):
    """What the agent asks of every live rank on its node.

    ``generation``: the group to form next (the controller's round; never reused while one
    rendezvous store lives). ``action``: ``rejoin`` (a rank was replaced), ``retry`` (same
    ranks, redo the step) or ``abort`` (give up: ranks exit with their error, for
    job-rescheduling). ``timeout``: how long a rank may take to form the group before it gives up.
    ``world_size`` and ``ranks`` (a scale-in or scale-out, issue 17; both or neither): the size of the group
    to form and the rank in it of each of the node's ranks, by the global rank it was started as (RANK).
    """

    generation: int
    action: str = "rejoin"
    timeout: float = DEFAULT_REJOIN_TIMEOUT
    time: float = 0.0
    extra: dict[str, Any] = {}
    world_size: int | None = None
    ranks: dict[int, int] = {}

    def rank_of(self, started_as: int) -> int | None:
        """The group rank of the process started as global rank ``started_as`` (None: no resize, or not named)."""
        return self.ranks.get(started_as) if self.world_size is not None else None

    @property
    def store_prefix(self) -> str:
        return STORE_PREFIX.format(generation=self.generation)

    def ends(self, generation: int) -> bool:
        """Whether this request means the group of ``generation`` is over: ``leave`` of it (or of a later one,
        the agent's newest), a ``rejoin`` of a later one, or ``abort``. A ``retry`` keeps the group."""
        if self.action == "leave":
            return self.generation >= generation
        return self.action == "abort" or (self.action == "rejoin" and self.generation > generation)


def _check_control(generation: object, action: object, timeout: object) -> None:
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise LiveProtocolError(f"control generation must be an integer >= 0, got {generation!r}")
    if action not in ACTIONS:
        raise LiveProtocolError(f"control action must be one of {', '.join(ACTIONS)}, got {action!r}")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise LiveProtocolError(f"control timeout must be a positive number of seconds, got {timeout!r}")


def _check_resize(world_size: object, ranks: object) -> dict[int, int]:
    """The ``ranks`` of a resize as {started-as rank: group rank}; LiveProtocolError naming what is wrong."""
    if world_size is None and ranks is None:
        return {}
    if world_size is None or ranks is None:
        raise LiveProtocolError("control world_size and ranks come together (a resize), got only one of them")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise LiveProtocolError(f"control world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(ranks, dict):
        raise LiveProtocolError(f"control ranks must map a started-as rank to its group rank, got {ranks!r}")
    out: dict[int, int] = {}
    for key, value in ranks.items():
        try:
            started = int(key)
        except (TypeError, ValueError):
            raise LiveProtocolError(f"control ranks key {key!r} is not a rank") from None
        if started < 0 or isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < world_size:
            raise LiveProtocolError(f"control ranks {key!r}: {value!r} is not a rank in [0, {world_size})")
        out[started] = value
    if len(set(out.values())) != len(out):
        raise LiveProtocolError(f"control ranks name a group rank twice: {ranks!r}")
    return out


def write_control(path: str | os.PathLike[str], generation: int, action: str = "rejoin",
                  timeout: float = DEFAULT_REJOIN_TIMEOUT, world_size: int | None = None,
                  ranks: dict[int, int] | None = None, **extra: Any) -> Control:
    """Atomically replace the control file (agent side): a rank never reads half a file."""
    _check_control(generation, action, timeout)
    resize = _check_resize(world_size, ranks)
    control = Control(generation, action, float(timeout), time.time(), dict(extra), world_size, resize)
    body = {"generation": generation, "action": action, "timeout": float(timeout), "time": control.time, **extra}
    if world_size is not None:
        body.update(world_size=world_size, ranks={str(k): v for k, v in sorted(resize.items())})
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(body, fh)
    os.replace(tmp, path)
    return control


def read_control(path: str | os.PathLike[str]) -> Control | None:
    """The control file's request, or None when there is no file yet; LiveProtocolError if malformed."""
    try:
        with open(path, encoding="utf-8") as fh:
            body = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LiveProtocolError(f"cannot read control file {os.fspath(path)}: {exc}") from exc
    if not isinstance(body, dict):
        raise LiveProtocolError(f"control file {os.fspath(path)} is not a JSON object")
    body = dict(body)
    generation, action = body.pop("generation", None), body.pop("action", "rejoin")
    timeout, when = body.pop("timeout", DEFAULT_REJOIN_TIMEOUT), body.pop("time", 0.0)
    world_size, ranks = body.pop("world_size", None), body.pop("ranks", None)
    _check_control(generation, action, timeout)
    resize = _check_resize(world_size, ranks)
    return Control(generation, action, float(timeout), float(when or 0.0), body, world_size, resize)


class ControlWatch:
    """Rank side: notices a new control file with one ``os.stat`` per check (~1 µs)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._seen: tuple[int, int, int] | None = None
        self._last: Control | None = None

    def latest(self) -> Control | None:
        """The current request; re-read only when the file changed (rename gives a new inode)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                control = read_control(self.path)
            except LiveProtocolError as exc:
                log.warning("%s", exc)
                return self._last
            self._seen, self._last = key, control
        return self._last

    def newer(self, generation: int) -> Control | None:
        """A request for a generation above ``generation``, else None (``leave`` names none to form)."""
        control = self.latest()
        return control if control is not None and control.generation > generation and control.action != "leave" \
            else None

    def wait(self, generation: int, timeout: float, interval: float = 0.005, idle: float = 0.05) -> Control | None:
        """Wait up to ``timeout`` seconds for a generation above ``generation``; None on timeout.

        Woken by inotify the moment the agent replaces the file (the rank is waiting while its peers wait for
        it), looking again every ``idle`` regardless; where inotify is missing it polls every ``interval``."""
        deadline = time.monotonic() + timeout
        with FileWatch(self.path, interval, idle) as watch:
            while True:
                control = self.newer(generation)
                left = deadline - time.monotonic()
                if control is not None or left <= 0:
                    return control
                watch.pause(left)
