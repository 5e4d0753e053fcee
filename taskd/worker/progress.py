"""The rank side of the heartbeat file: progress, sections and save requests.

Everything here is a no-op when the rank does not run under taskd (no
``TASKD_HEARTBEAT_FILE`` / ``TASKD_HEARTBEAT_DIR``), so scripts keep working
under plain python, torchrun or msrun.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from taskd.worker import continued
from taskd.worker import heartbeat_file as hbf
from taskd.worker.env import Var, in_spare, rank

log = logging.getLogger(__name__)

DEFAULT_STACK_SIGNAL = signal.SIGUSR2


class _Beacon:
    """This process's writer into its heartbeat file."""

    def __init__(self, file: hbf.HeartbeatFile) -> None:
        self.file = file
        self.buf = file.buffer
        self.lock = threading.Lock()
        self.seq = hbf.SEQ.unpack_from(self.buf, hbf.OFF_SEQ)[0] & ~1
        self.step = -1
        self.beats = 0
        self.handled = hbf.ACK.unpack_from(self.buf, hbf.OFF_ACK)[0]
        self.sections: list[tuple[str, float, float]] = []  # (name, timeout, start)
        self.finishing = hbf.FINISHING_NO
        # the rank's pace (heartbeat_file, bytes 232-247): monotonic seconds, waits in collectives left out
        self.last_beat: float | None = None
        self.wait_depth = 0
        self.wait_since: float | None = None
        self.waited = 0.0  # seconds inside collectives since the last heartbeat
        self.compute = 0.0
        self.intervals = 0
        self.stack_signal = _install_stack_dump()
        continued.install(self.buf)  # after a stop, no step before the agent's word (issue 31)
        with self.lock:
            self._begin()
            hbf.IDENT.pack_into(self.buf, hbf.OFF_IDENT, os.getpid(), self.stack_signal)
            self._end()

    def _begin(self) -> None:
        self.seq += 1
        hbf.SEQ.pack_into(self.buf, hbf.OFF_SEQ, self.seq)

    def _end(self) -> None:
        self.seq += 1
        hbf.SEQ.pack_into(self.buf, hbf.OFF_SEQ, self.seq)

    def beat(self, step: int | None) -> None:
        if step is not None:
            self.step = step
        with self.lock:
            now = time.monotonic()
            if self.last_beat is not None:  # this interval's compute: its length less its waits on peers
                waited = self.waited + (now - self.wait_since if self.wait_since is not None else 0.0)
                self.compute += max(0.0, now - self.last_beat - waited)
                self.intervals += 1
            self.last_beat, self.waited = now, 0.0
            if self.wait_since is not None:
                self.wait_since = now
            self.seq += 1
            buf = self.buf
            hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, self.seq)
            hbf.BEAT.pack_into(buf, hbf.OFF_BEAT, time.time(), self.step)
            self.beats += 1
            hbf.COUNT.pack_into(buf, hbf.OFF_COUNT, self.beats)
            hbf.COMPUTE.pack_into(buf, hbf.OFF_COMPUTE, self.compute, self.intervals)
            self.seq += 1
            hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, self.seq)
        if self.pending():
            self.answer_save_request()

    def pending(self) -> bool:
        """Whether the agent asked for a save this rank has not served yet."""
        return hbf.REQUEST.unpack_from(self.buf, hbf.OFF_REQUEST)[0] > self.handled

    def mark_wait(self, inside: bool) -> None:
        """Entering (True) or leaving (False) a wait on peers; nested marks count once."""
        with self.lock:
            now = time.monotonic()
            if inside:
                self.wait_depth += 1
                if self.wait_depth == 1:
                    self.wait_since = now
                return
            self.wait_depth = max(0, self.wait_depth - 1)
            if self.wait_depth == 0 and self.wait_since is not None:
                self.waited += now - self.wait_since
                self.wait_since = None

    def forget_interval(self) -> None:
        """The time since the last heartbeat is nobody's compute (a group rebuilt, a step redone): not counted."""
        with self.lock:
            self.last_beat, self.waited, self.wait_depth, self.wait_since = None, 0.0, 0, None

    def write_section(self, touch: bool) -> None:
        """Publish the innermost open section (or none); ``touch`` also counts as a heartbeat."""
        name, timeout, start = self.sections[-1] if self.sections else ("", 0.0, 0.0)
        encoded = name.encode("utf-8")[: hbf.SECTION_MAX]
        with self.lock:
            self._begin()
            hbf.SECTION.pack_into(self.buf, hbf.OFF_SECTION, timeout, start)
            hbf.NAME.pack_into(self.buf, hbf.OFF_NAME, len(encoded), encoded)
            if touch:
                hbf.BEAT.pack_into(self.buf, hbf.OFF_BEAT, time.time(), self.step)
            self._end()

    def mark_finishing(self, kind: int) -> None:
        """Say the rank is on its way out (see ``finished()``); the first mark's time stands, "done" wins."""
        if kind <= self.finishing:
            return
        since = time.time() if self.finishing == hbf.FINISHING_NO else None
        with self.lock:
            self._begin()
            if since is None:  # exiting already: keep its time, upgrade the kind
                hbf.U32.pack_into(self.buf, hbf.OFF_FINISH, kind)
            else:
                hbf.FINISH.pack_into(self.buf, hbf.OFF_FINISH, kind, since)
            self._end()
        self.finishing = kind

    def write_fields(self, fields: Iterable[tuple[struct.Struct, int, tuple]]) -> None:
        """Write rank-side fields (struct, offset, values) as one update under the sequence counter."""
        with self.lock:
            self._begin()
            for layout, offset, values in fields:
                layout.pack_into(self.buf, offset, *values)
            self._end()

    def answer_save_request(self) -> bool:
        request = hbf.REQUEST.unpack_from(self.buf, hbf.OFF_REQUEST)[0]
        self.handled = request  # before the callback: a heartbeat() inside it must not recurse
        callback = _save_callback
        ok = False
        if callback is None:
            log.warning("taskd asked this rank to save, but no on_save_request callback is registered")
        else:
            try:
                with section("save_request"):
                    result = callback()
                ok = result is not False
            except Exception:
                log.exception("the on_save_request callback failed")
        with self.lock:
            self._begin()
            hbf.ACK.pack_into(self.buf, hbf.OFF_ACK, request, 1 if ok else 0)
            self._end()
        return ok


def _install_stack_dump() -> int:
    """Let the agent ask for this rank's Python stacks (into its log) before it kills a hung rank.

    Returns the signal number, or 0 when the signal already has a handler of the script's own.
    """
    sig = _stack_signal()
    if not sig:
        return 0
    try:
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            return 0
        faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=False)
    except (ValueError, RuntimeError, OSError, AttributeError) as exc:  # no stderr, not the main interpreter...
        log.debug("cannot register stack dump on signal %s: %s", sig, exc)
        return 0
    return int(sig)


def _stack_signal() -> int:
    value = os.environ.get("TASKD_STACK_SIGNAL", "")
    if not value:
        return int(DEFAULT_STACK_SIGNAL)
    if value.isdigit():
        return int(value)
    try:
        return int(signal.Signals[value if value.startswith("SIG") else "SIG" + value])
    except KeyError:
        log.warning("TASKD_STACK_SIGNAL=%r is not a signal; stack dumps disabled", value)
        return 0


_DISABLED = object()
_beacon: _Beacon | object | None = None
_beacon_lock = threading.Lock()
_save_callback: Callable[[], object] | None = None


def _heartbeat_path() -> str | None:
    path = os.environ.get(Var.TASKD_HEARTBEAT_FILE)
    if path:
        return path
    directory = os.environ.get(Var.TASKD_HEARTBEAT_DIR)
    if directory:  # ranks started by another launcher (msrun) with a taskd agent
        return os.path.join(directory, f"rank_{rank()}.hb")
    return None


def _attach() -> _Beacon | None:
    global _beacon
    with _beacon_lock:
        if _beacon is None and in_spare():
            return None  # a warm spare that is no rank yet: it gets its heartbeat file when it becomes one
        if _beacon is None:
            _beacon = _DISABLED
            path = _heartbeat_path()
            if path:
                try:
                    file = hbf.HeartbeatFile(path)
                    if not os.path.exists(path) and not os.environ.get(Var.TASKD_HEARTBEAT_FILE):
                        file.create()
                    _beacon = _Beacon(file.open())
                    # registered now, after the script's imports: runs before their handlers (last in, first
                    # out) and before C-level finalisation
                    atexit.register(_at_exit)
                except (OSError, hbf.HeartbeatFileError) as exc:
                    log.warning("heartbeats disabled: %s", exc)
        return _beacon if isinstance(_beacon, _Beacon) else None


def _at_exit() -> None:
    """The interpreter is exiting: what follows (framework finalisation, e.g. MindSpore's) sends no heartbeats
    and must not be taken for a hang."""
    if isinstance(_beacon, _Beacon):
        try:
            _beacon.mark_finishing(hbf.FINISHING_EXIT)
        except (ValueError, OSError):  # the mapping is already closed
            pass



def reattach() -> None:
    """Forget this process's heartbeat file: the next heartbeat attaches again, reading TASKD_HEARTBEAT_FILE anew
    (a benchmark that times heartbeats without, then with, a file)."""
    global _beacon
    with _beacon_lock:
        _beacon = None


def _forget_in_child() -> None:
    """A forked child (e.g. a data loader worker) must not beat for its parent rank."""
    global _beacon
    _beacon = _DISABLED
    continued.forget()


os.register_at_fork(after_in_child=_forget_in_child)


def write_fields(fields: Iterable[tuple[struct.Struct, int, tuple]]) -> bool:
    """Write rank-side fields of this rank's heartbeat file atomically (for ``taskd.worker.live``).

    False, and nothing written, when the rank has no heartbeat file (not under taskd).
    """
    beacon = _current()
    if beacon is None:
        return False
    beacon.write_fields(fields)
    return True


def heartbeat(step: int | None = None) -> None:
    """Tell taskd this rank is making progress (call once per step); serves pending save requests.

    Costs a few microseconds under taskd and nothing measurable elsewhere. The
    first call also turns hang detection on for this rank.
    """
    beacon = _beacon
    if beacon is _DISABLED:
        return
    if beacon is None:
        beacon = _attach()
        if beacon is None:
            return
    beacon.beat(step)  # type: ignore[union-attr]


@contextmanager
def section(name: str, timeout: float | None = None) -> Iterator[None]:
    """Mark a phase that may legitimately go without heartbeats (checkpoint save, evaluation, data loading).

    Inside it the agent's hang check uses ``timeout`` seconds from the section's
    start instead of the heartbeat timeout. Sections nest; leaving one counts as a
    heartbeat.
    """
    if timeout is not None and timeout <= 0:
        raise ValueError(f"section timeout must be positive, got {timeout!r}")
    beacon = _current()
    if beacon is None:
        yield
        return
    beacon.sections.append((str(name), float(timeout or 0.0), time.time()))
    beacon.write_section(touch=False)
    try:
        yield
    finally:
        if beacon.sections:
            beacon.sections.pop()
        beacon.write_section(touch=True)


def _current() -> _Beacon | None:
    """This process's beacon, attached on first use; None where the rank has no heartbeat file."""
    return _beacon if isinstance(_beacon, _Beacon) else (None if _beacon is _DISABLED else _attach())


def mark_wait(inside: bool) -> None:
    """Mark entering or leaving a wait on peers (``taskd.worker.torch.LiveGroup`` marks its collectives)."""
    beacon = _current()
    if beacon is not None:
        beacon.mark_wait(inside)


def forget_interval() -> None:
    """Leave the time since the last heartbeat out of this rank's compute time (a recovery, not a step)."""
    beacon = _current()
    if beacon is not None:
        beacon.forget_interval()


@contextmanager
def collective() -> Iterator[None]:
    """Mark a wait on the other ranks (a collective, a barrier): not this rank's own compute time.

    The agent compares ranks on the time between heartbeats spent *outside* such waits, to name the rank
    that makes the others wait (``--straggler-factor``). In data-parallel training every rank steps at the
    slowest's pace, so without these marks all ranks look alike. ``LiveGroup`` marks its collectives itself;
    a script of its own wraps its ``all_reduce``/``barrier`` calls (or DDP's backward) in it. Does nothing
    outside taskd.
    """
    beacon = _current()
    if beacon is None:
        yield
        return
    beacon.mark_wait(True)
    try:
        yield
    finally:
        beacon.mark_wait(False)


def on_save_request(callback: Callable[[], object] | None) -> None:
    """Run ``callback()`` when taskd asks this rank to save now (e.g. before stopping the job).

    It runs inside the next ``heartbeat()`` call, i.e. at a step boundary, once
    per request. Returning ``False`` or raising reports the save as failed.
    ``None`` removes the callback.
    """
    global _save_callback
    _save_callback = callback


def serve_save_request(wait: float = 0.0) -> bool | None:
    """Serve a save request now, on the calling thread, waiting up to ``wait`` seconds for one to come.

    True when the ``on_save_request`` callback saved, False when it failed, None when no request came
    (or the rank does not run under taskd). For a rank whose step failed where ``heartbeat()`` is never
    reached again: ``save_on_error()`` calls it.
    """
    if wait < 0:
        raise ValueError(f"wait must be >= 0 seconds, got {wait!r}")
    beacon = _current()
    if beacon is None:
        return None
    deadline = time.monotonic() + wait
    while not beacon.pending():
        if time.monotonic() >= deadline:
            return None
        time.sleep(_REQUEST_POLL)
    return beacon.answer_save_request()


_REQUEST_POLL = 0.02  # seconds between looks for a save request the agent is about to make
SAVE_WAIT = 5.0  # seconds a failed step waits for the dump's save request (the round takes well under one)


@contextmanager
def save_on_error(wait: float | None = None) -> Iterator[None]:
    """Serve the dump's save request when the block raises (e.g. a collective that failed because a peer
    died), on this thread, before the exception goes on.

    A rank whose peer died never reaches its next ``heartbeat()``: it waits in the collective until the
    framework gives up on it (MindSpore: ``MS_CPU_COMM_OP_TIMEOUT``). Its state is still the last step's
    (the update that needed the collective never ran), so that is what the callback saves. When the
    job offers ``dump`` (``TASKD_STRATEGIES``) the block waits up to ``wait`` seconds (default 5) for
    the request if the agent has not made it yet; otherwise only a request already made is served.
    """
    try:
        yield
    except Exception as error:  # not SystemExit/KeyboardInterrupt: a rank being stopped does not wait
        serve_after_error(wait, error)
        raise


def error_summary(error: BaseException) -> str:
    """The line of an exception's message that names it; MindSpore's open with rules and section titles
    ("- Kernel error:") and put "Launch kernel failed: ..." below them."""
    for line in str(error).splitlines():
        text = line.strip()
        if text and text.strip("-") and not text.startswith("- "):
            return f"{type(error).__name__}: {text[:300]}"
    return type(error).__name__


def serve_after_error(wait: float | None = None, error: BaseException | None = None) -> bool | None:
    """A step raised: serve the dump's save request (``save_on_error``); never raises.

    When the job offers ``dump`` it says so first, on stderr, with the error: the agent may stop the
    rank as soon as it saved, before the interpreter prints the traceback."""
    offered = "dump" in os.environ.get("TASKD_STRATEGIES", "")
    if offered and error is not None and _current() is not None:
        log.warning("a step raised %s; serving the dump's save request before it goes on", error_summary(error))
    try:
        return serve_save_request((SAVE_WAIT if wait is None else wait) if offered else 0.0)
    except Exception:  # never hide the step's own error behind ours
        log.exception("serving the save request after a failed step failed")
        return False


def finished() -> None:
    """Tell taskd this rank's work is done: what follows (writing results, the framework's finalisation,
    interpreter exit) sends no heartbeats and is not a hang.

    Call it once, after the last step. The interpreter's exit marks the rank the same way by itself
    (atexit). The agent still waits only so long for the process to end (the heartbeat timeout plus
    ``TASKD_STOP_GRACE``); a rank that called ``finished()`` and is killed then still counts as having
    succeeded, one that did not counts as failed. Does nothing outside taskd.
    """
    beacon = _current()
    if beacon is not None:
        beacon.mark_finishing(hbf.FINISHING_DONE)
