"""Live recovery, the framework-neutral half: what a rank and its agent tell each other.

A collective job survives a lost rank only if every rank takes part: the survivors abandon the
step in flight, wait for the agent to name a new group *generation*, rebuild their communicator
in place with a replacement rank and hand it their state. Nothing here knows a framework; the
torch binding (``taskd.worker.torch``) and a future MindSpore one sit on top of it.

Agent -> ranks: one control file per node (``TASKD_CONTROL_FILE``), JSON, replaced atomically
(write + rename), so a rank checks it at each step boundary with one ``os.stat``.

Ranks -> agent: fields 152-219 of each rank's heartbeat file (layout in
``taskd.worker.heartbeat_file``), written under its sequence counter; the agent reads them
with :func:`read_rank_status`.

The full protocol is written up in docs/worker.md, "Live recovery protocol".
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
import struct
import time
from typing import NamedTuple

from taskd.worker import heartbeat_file as hbf
from taskd.worker import progress
from taskd.worker.control_file import (  # the control file is part of this protocol: its names are here too
    ACTIONS,
    DEFAULT_REJOIN_TIMEOUT,
    STORE_PREFIX,
    Control,
    ControlWatch,
    LiveProtocolError,
    read_control,
    write_control,
)
from taskd.worker.env import Var, env_int, ring_agent

log = logging.getLogger(__name__)

FLAG_REJOIN = 1  # the rank can rejoin a rebuilt group in place (survivor) or be started into one (replacement)
FLAG_RETRY = 2  # the rank can roll back the step in flight and redo it without a restart
FLAG_DECLARED = 4  # set by every declare(): "neither" is then an answer (sharded state), not "not yet declared"
FLAG_RESIZE = 8  # the rank has a resize hook (LiveGroup(on_resize=...)): the job may go on at another world size


STUCK_EXIT = 75
"""The exit code of a rank that ended itself left blocked in its broken group (taskd.worker.torch_stuck): a survivor
whose state its peers hold, so its agent starts it again into the group being re-formed."""

SHARDS_LOST_EXIT = 76
"""A rank's exit code when live recovery refused because shards are lost (`ShardsLost`, taskd.worker.torch_retry),
after it said GAVE_UP: the agent takes the ranks' exits as the rebuild's failure, and the round goes on to
job-rescheduling; it counts them as refusals, not faults (agent/summary.py)."""


class Phase(enum.IntEnum):
    """Where a live rank stands, as the agent sees it."""

    TRAINING = 0
    PAUSED = 1  # left its group; waiting for the control file to name a newer generation
    REJOINING = 2  # forming the group of the generation it was given, then syncing state
    GAVE_UP = 3  # no generation came in time, or abort: the rank exits with the original error
    COMPLETE = 4  # its steps() loop ran to its end: an exit now is no rank leaving its group early


class ErrorKind(enum.IntEnum):
    """Why a live rank left its group without dying."""

    NONE = 0
    RETRYABLE = 1  # the script raised RetryableError (fault type "0": retry in place)
    COLLECTIVE_TIMEOUT = 2  # a collective timed out (a peer hangs)
    PEER_LOST = 3  # a collective failed: a peer died or left its group


class RetryableError(Exception):
    """Raise it in a step to have every rank roll the step back and redo it in place (``retry``).

    Only under taskd with live recovery; elsewhere it propagates like any exception.
    """


# -- ranks -> agent: the heartbeat file's live fields ---------------------------------------------
class RankStatus(NamedTuple):
    """One consistent snapshot of a rank's heartbeat file, live fields included."""

    heartbeat: hbf.HeartbeatState
    can_rejoin: bool
    can_retry: bool
    phase: Phase
    generation: int | None  # None until the rank has joined a generation
    resume_step: int | None  # the step it continued from after joining it
    joined_time: float | None
    collective_since: float | None  # set while the rank is inside a collective (waiting on peers)
    errors: int  # in-place errors so far; compare with the previous read to see a new one
    error_kind: ErrorKind
    error_step: int | None
    error_time: float | None
    torn: bool = False
    declared: bool = False  # the rank said what it can do in place (possibly nothing)
    can_resize: bool = False  # it re-shards through a resize hook: its job may scale in and out (issue 17)

    def erred_before_joining(self) -> bool:
        """Whether its last in-place error came before it joined its current generation: an old group's, read only
        once the rank had moved on (a timed-out collective of a group a recovery left behind)."""
        return self.error_time is not None and self.joined_time is not None and self.error_time < self.joined_time

    def rejoined(self, generation: int) -> bool:
        """Whether the rank has joined ``generation`` (or a later one) and is past the state sync."""
        return self.generation is not None and self.generation >= generation \
            and self.phase in (Phase.TRAINING, Phase.COMPLETE)

    def resumed(self, generation: int) -> bool:
        """Whether it has also completed a step in that generation (its heartbeat step passed resume_step)."""
        step = self.heartbeat.step
        return self.rejoined(generation) and step is not None and self.resume_step is not None \
            and step >= self.resume_step


_NO_LIVE = (0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0.0)


def _status(state: hbf.HeartbeatState, live: tuple, torn: bool) -> RankStatus:
    flags, phase, gen, rstep, jtime, coll, errors, kind, estep, etime = live
    joined = jtime > 0.0
    try:
        phase_v, kind_v = Phase(phase), ErrorKind(kind)
    except ValueError:  # a newer writer: report what we understand
        phase_v, kind_v = Phase.TRAINING, ErrorKind.NONE
    return RankStatus(
        heartbeat=state, can_rejoin=bool(flags & FLAG_REJOIN), can_retry=bool(flags & FLAG_RETRY),
        declared=bool(flags & (FLAG_DECLARED | FLAG_REJOIN | FLAG_RETRY)),
        phase=phase_v, generation=gen if joined else None, resume_step=rstep if joined else None,
        joined_time=jtime if joined else None, collective_since=coll or None, errors=errors,
        error_kind=kind_v, error_step=estep if errors else None, error_time=etime or None, torn=torn,
        can_resize=bool(flags & FLAG_RESIZE),
    )


def read_rank_status(file: hbf.HeartbeatFile | str | os.PathLike[str], retries: int = 100) -> RankStatus:
    """Read a rank's heartbeat and live fields in one consistent snapshot (agent side, ~3 µs).

    Pass the agent's ``HeartbeatFile`` to reuse its mapping; a path opens (and closes) one.
    A torn file (rank killed mid-write) gives the "not declared" live fields and ``torn=True``.
    """
    own = not isinstance(file, hbf.HeartbeatFile)
    hb = hbf.HeartbeatFile(file) if own else file
    try:
        mapping = hb.buffer
        end = hbf.OFF_LIVE + hbf.LIVE.size
        for attempt in range(max(1, retries)):
            seq = hbf.SEQ.unpack_from(mapping, hbf.OFF_SEQ)[0]
            if seq % 2 == 0:
                data = mapping[:end]
                if hbf.SEQ.unpack_from(mapping, hbf.OFF_SEQ)[0] == seq:
                    state = hbf.state_from(hbf.ALL.unpack_from(data, 0))
                    return _status(state, hbf.LIVE.unpack_from(data, hbf.OFF_LIVE), torn=False)
            time.sleep(0 if attempt < hbf.SPIN_RETRIES else hbf.RETRY_SLEEP)
        return _status(hb.read(retries=1), _NO_LIVE, torn=True)
    finally:
        if own:
            hb.close()


# -- the rank side --------------------------------------------------------------------------------
def _generation_var(name: str) -> int | None:
    """A generation in variable ``name`` (None when unset); LiveProtocolError naming the variable otherwise."""
    try:
        value = env_int(name, None)
    except ValueError as exc:
        raise LiveProtocolError(str(exc)) from None
    if value is not None and value < 0:
        raise LiveProtocolError(f"{name}={value} must be >= 0")
    return value


def start_generation() -> int:
    """The generation this process was started into: 0 at job start, g for a replacement (TASKD_GENERATION)."""
    return _generation_var(Var.TASKD_GENERATION) or 0


def join_after() -> int | None:
    """For a replacement started before the controller named its generation (TASKD_JOIN_AFTER, taskd.launcher's
    prepared replacement): it joins the first generation the control file names above this one; None otherwise."""
    return _generation_var(Var.TASKD_JOIN_AFTER)


def rejoin_timeout() -> float:
    """How long a paused rank waits for the agent to name a generation (TASKD_REJOIN_TIMEOUT, s)."""
    value = os.environ.get(Var.TASKD_REJOIN_TIMEOUT, "").strip()
    if not value:
        return DEFAULT_REJOIN_TIMEOUT
    try:
        timeout = float(value)
    except ValueError:
        raise LiveProtocolError(f"{Var.TASKD_REJOIN_TIMEOUT}={value!r} is not a number of seconds") from None
    if timeout <= 0:
        raise LiveProtocolError(f"{Var.TASKD_REJOIN_TIMEOUT}={value!r} must be positive")
    return timeout


class LiveRank:
    """This rank's side of the protocol: its declarations and reports, and the agent's requests.

    Reports are no-ops without a heartbeat file; requests need ``TASKD_CONTROL_FILE``.
    """

    def __init__(self, control_path: str | None = None) -> None:
        self.control_path = control_path or os.environ.get(Var.TASKD_CONTROL_FILE) or None
        self.watch = ControlWatch(self.control_path) if self.control_path else None
        self.generation = start_generation()
        self.join_after = join_after()  # a prepared replacement: its generation is named after it started
        self.errors = 0

    @property
    def enabled(self) -> bool:
        return self.watch is not None

    def await_named(self) -> bool:
        """A prepared replacement (TASKD_JOIN_AFTER): started the moment its predecessor died, its script (imports,
        model, optimizer) ran while the controller decided; now it waits for the round to name its generation.
        False when none comes in time or the agent says anything but rejoin (the rank then gives up)."""
        assert self.watch is not None and self.join_after is not None
        control = self.watch.wait(self.join_after, rejoin_timeout())
        if control is None or control.action not in ("rejoin", "migrate"):  # a migration's successor: "migrate"
            return False
        self.generation = control.generation
        return True

    def declare(self, rejoin: bool = True, retry: bool = True, resize: bool = False) -> bool:
        """Tell the agent what this rank can do in place; False when there is no heartbeat file."""
        flags = FLAG_DECLARED | (FLAG_REJOIN if rejoin else 0) | (FLAG_RETRY if retry else 0) \
            | (FLAG_RESIZE if resize else 0)
        return progress.write_fields([(_U32, hbf.OFF_LIVE_FLAGS, (flags,))])

    def set_phase(self, phase: Phase) -> None:
        progress.write_fields([(_U32, hbf.OFF_LIVE_PHASE, (int(phase),))])

    def joined(self, generation: int, step: int) -> None:
        """Report "joined ``generation``, continuing from ``step``" (state synced, training again)."""
        self.generation = generation
        progress.forget_interval()  # joining a group is no step of anyone's: not compute time
        progress.write_fields([
            (_JOIN, hbf.OFF_LIVE_JOIN, (generation, step, time.time())),
            (_U32, hbf.OFF_LIVE_PHASE, (int(Phase.TRAINING),)),
        ])

    def collective(self, inside: bool) -> None:
        """Mark entering (True) or leaving (False) a collective: waiting on peers is not hanging, nor is it
        this rank's compute time (the straggler comparison)."""
        progress.mark_wait(inside)
        progress.write_fields([(_F64, hbf.OFF_LIVE_COLLECTIVE, (time.time() if inside else 0.0,))])

    def report_error(self, kind: ErrorKind, step: int) -> None:
        """Report an in-place error (the rank is alive and pauses) so the agent can choose retry/recover."""
        self.errors += 1
        progress.forget_interval()
        progress.write_fields([
            (_ERROR, hbf.OFF_LIVE_ERROR, (self.errors, int(kind), step, time.time())),
            (_F64, hbf.OFF_LIVE_COLLECTIVE, (0.0,)),
            (_U32, hbf.OFF_LIVE_PHASE, (int(Phase.PAUSED),)),
        ])
        ring_agent()

    def requested(self) -> Control | None:
        """A request for a newer generation, checked at a step boundary (one stat); None if none."""
        return self.watch.newer(self.generation) if self.watch is not None else None

    def wait_requested(self, timeout: float | None = None) -> Control | None:
        """Wait for the agent to name a newer generation; None after ``timeout`` (TASKD_REJOIN_TIMEOUT)."""
        if self.watch is None:
            return None
        return self.watch.wait(self.generation, rejoin_timeout() if timeout is None else timeout)


_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_JOIN = struct.Struct("<qqd")
_ERROR = struct.Struct("<QIqd")

_TIMEOUT_MARKERS = ("timed out", "timeout")
_PEER_MARKERS = ("connection closed", "connection reset", "broken pipe", "connection refused", "gloo",
                 "socket", "peer", "nccl", "hccl", "process group", "processgroup", "aborted")


def classify_error(exc: BaseException, from_collective: bool | None = None) -> ErrorKind | None:
    """Which in-place error ``exc`` is, or None when it is an error of the script's own (it must propagate).

    ``from_collective``: the framework binding's word on where ``exc`` was raised (for torch,
    taskd.worker.torch_origin marks it at the collectives' call sites). False: the script raised it, in
    its step body, a module's ``forward``, a backward hook or a data read, so it propagates whatever its
    type and text, and its rank exits and is replaced like any crashed rank (issue 32, F1: a
    ``TimeoutError`` in a ``forward`` stalled every rank 2 minutes). Only the framework's own
    distributed error types (``DistError``...) count without a mark. None (no binding's word): the
    type and the message decide, as they must for a collective's error too (torch's gloo errors are
    plain RuntimeErrors): an error raised by a collective but reading like no fault of a peer (a
    usage error) still propagates.
    """
    if isinstance(exc, RetryableError):
        return ErrorKind.RETRYABLE
    if not isinstance(exc, RuntimeError | OSError | TimeoutError | ConnectionError):
        return None
    names = {cls.__name__ for cls in type(exc).__mro__}
    if from_collective is False and not names & _DIST_ERRORS:
        return None
    text = str(exc).lower()
    if isinstance(exc, TimeoutError) or any(m in text for m in _TIMEOUT_MARKERS):
        return ErrorKind.COLLECTIVE_TIMEOUT
    if names & _DIST_ERRORS or isinstance(exc, ConnectionError) or any(m in text for m in _PEER_MARKERS):
        return ErrorKind.PEER_LOST
    return None


_DIST_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})


def why_not_live() -> str:
    """What a LiveGroup under `taskd run` without live recovery tells the user ("" elsewhere: torchrun, python).

    taskd run hosts the store that outlives rank 0 only for code it can see using this binding
    (taskd/rendezvous/live_binding.py); a script started in a way it cannot read (a shell wrapper) would otherwise
    learn only at its first fault that every rank restarts (issue 32, F3)."""
    if not os.environ.get(Var.TASKD_HEARTBEAT_FILE):
        return ""
    if os.environ.get("TASKD_RDZV_STORE", "").strip() == "rank":
        return ("live recovery is off for this job (TASKD_RDZV_STORE=rank): a fault restarts every rank from its "
                "checkpoint (job-rescheduling); unset it to recover in place")
    return ("live recovery is off for this job: taskd run did not see that its ranks use LiveGroup (it reads the "
            "entry script, the modules of its own it imports, and the script of a --no-python command's python), so "
            "rank 0 hosts the rendezvous store and a fault restarts every rank from its checkpoint; set "
            "TASKD_RDZV_STORE=agent for this job to recover in place")


def declare_rejoinable(retry: bool = False) -> bool:
    """For scripts whose ranks never talk to each other: a restarted rank needs nothing from the others.

    Declares the rank able to be replaced in place, so the agent offers ``recover``. False
    when not under taskd (no heartbeat file).
    """
    return LiveRank().declare(rejoin=True, retry=retry)


def preimport(modules: str | list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Import ``modules`` now (default: the comma-separated TASKD_PREIMPORT), e.g. in a warm spare.

    A spare that has imported torch before it becomes a rank saves the replacement ~1.4 s.
    Returns the modules imported; one that fails to import is logged and skipped (the rank will
    import it again and report the real error itself).
    """
    if modules is None:
        modules = os.environ.get(Var.TASKD_PREIMPORT, "")
    if isinstance(modules, str):
        modules = [m.strip() for m in modules.split(",")]
    done = []
    for name in modules:
        if not name:
            continue
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the rank's to report later
            log.warning("preimport of %s failed: %s", name, exc)
    return done


__all__ = ["ACTIONS", "DEFAULT_REJOIN_TIMEOUT", "FLAG_DECLARED", "FLAG_REJOIN", "FLAG_RESIZE", "FLAG_RETRY",
           "SHARDS_LOST_EXIT", "STORE_PREFIX", "STUCK_EXIT", "Control", "ControlWatch", "ErrorKind",
           "LiveProtocolError", "LiveRank", "Phase", "RankStatus", "RetryableError", "classify_error",
           "declare_rejoinable", "join_after", "preimport", "read_control", "read_rank_status", "rejoin_timeout",
           "start_generation", "why_not_live", "write_control"]
