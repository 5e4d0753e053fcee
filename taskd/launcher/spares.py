"""Warm spares: Python interpreters started ahead of time that become a rank when one is needed.

A restarted rank spends most of its first ~35 ms starting a Python interpreter. A spare has
already done that: it waits on its stdin for the rank's environment and argv, then runs the
script with `runpy.run_path(..., run_name="__main__")`, as `python -u script.py` would (same
interpreter, `sys.argv`, `sys.path[0]` = the script's directory, `__name__ == "__main__"`,
exit code 1 and a traceback on an exception). Only for `.py` entrypoints; opt-in
(`taskd run --warm-spares N`). With TASKD_PREIMPORT (set to `torch` for live-recovery jobs) a spare
imports those modules first (`taskd.worker.live.preimport`), so a replacement skips torch's import.

In script mode (`--warm-spare-mode script`, the pool given the script's ``argv``) a spare runs the script
itself, with no rank variables, until the script calls `taskd.worker.become_rank()` (`LiveGroup()` does)
and reads the rank there: a replacement's model is then built before the fault (taskd.worker.spare).

After a spare becomes a rank the pool is refilled `REFILL_DELAY` seconds later, not at once: the new
spare's import of torch takes seconds of CPU, and on a 2-core machine it ran alongside the recovery it
had just made fast (kill -> every rank past its next step, 4 ranks: p50 0.77 s with the refill at once,
0.49 s with it deferred; BENCHMARKS.md). A second fault within that time gets a fresh interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from taskd.launcher.env import spare_env
from taskd.launcher.spec import LIVE_PREIMPORT, WorkerSpec
from taskd.process.spawn import has_exited, kill_group, reap, spawn
from taskd.worker.env import Var

log = logging.getLogger(__name__)

# Runs in the spare (`python -u -c`): taskd.worker.spare is stdlib only and leaves nothing in the namespace the
# script runs in.
SPARE_CODE = r"""
from taskd.worker.spare import run_spare
run_spare()
"""


def python_script(entrypoint: Sequence[str]) -> str | None:
    """The script of a `[sys.executable, "-u", script.py, ...]` entrypoint, else None (no spares)."""
    if len(entrypoint) >= 3 and entrypoint[0] == sys.executable and entrypoint[1] == "-u" \
            and entrypoint[2].endswith(".py"):
        return entrypoint[2]
    return None


REFILL_DELAY = 5.0  # seconds from a spare becoming a rank to its successor's start
PREPARED_MAY_DIFFER = frozenset({Var.TASKD_GENERATION, Var.TASKD_JOIN_AFTER, Var.TASKD_HEARTBEAT_FILE})
"""What a prepared replacement's variables may differ in from its START's: the generation, named after it started,
and (a migration's successor) the heartbeat file it wrote while its predecessor still ran, moved at its START."""


class SparePool:
    """Idle interpreters owned by the launcher; activated from the launcher's callers' thread, refilled from it
    or, after an activation, from the pool's own refill thread."""

    def __init__(self, size: int, env: Mapping[str, str], cwd: str | None, refill_delay: float | None = None,
                 script_argv: Sequence[str] | None = None) -> None:
        """``script_argv`` (script mode): the script and its arguments, which each spare runs until
        `become_rank`; ``env`` must then hold no rank's variables (taskd.launcher.env.spare_env)."""
        refill_delay = REFILL_DELAY if refill_delay is None else refill_delay
        if refill_delay < 0:
            raise ValueError(f"refill_delay must be >= 0 seconds, got {refill_delay}")
        self.size = max(0, size)
        self._env = dict(env)
        self._script_argv = None if script_argv is None else list(script_argv)
        if self._script_argv is not None:
            self._env.update({Var.TASKD_SPARE: "1", Var.TASKD_SPARE_ARGV: json.dumps(self._script_argv)})
        self._cwd = cwd
        self._refill_delay = refill_delay
        self._idle: list[subprocess.Popen[bytes]] = []
        self._bound: dict[int, tuple[subprocess.Popen[bytes], dict[str, str]]] = {}  # key -> handed a rank early
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due: float | None = None  # when the deferred refill is to run
        self._refiller: threading.Thread | None = None
        self._closed = False

    @classmethod
    def for_spec(cls, spec: WorkerSpec, live: bool) -> SparePool:
        """The launcher's pool: ``spec``'s size and mode (only `.py` entrypoints get spares); a live job's spares
        pre-import torch and LiveGroup (LIVE_PREIMPORT) unless TASKD_PREIMPORT says otherwise."""
        size = spec.warm_spares if python_script(spec.entrypoint) else 0
        script_mode = spec.warm_spare_mode == "script"
        env = spare_env(spec, script_mode)
        preimport = spec.preimport or (LIVE_PREIMPORT if live else "")
        if preimport:
            env[Var.TASKD_PREIMPORT] = preimport
        return cls(size, env, spec.cwd, script_argv=spec.entrypoint[2:] if script_mode else None)

    def fill(self) -> None:
        """Start spares until the pool is full (now; a refill already scheduled then finds nothing to do)."""
        with self._lock:
            if not self._closed:
                self._fill()

    def refill_later(self) -> None:
        """Fill the pool `refill_delay` seconds from now, once the recovery that used a spare is past."""
        with self._lock:
            if self._closed or len(self._idle) >= self.size:
                return
            if self._due is None:
                self._due = time.monotonic() + self._refill_delay
            if self._refiller is None:
                # one thread for the pool's life, not a timer's: a spare's death signal fires when the thread
                # that spawned it ends (taskd/process/spawn.py), and a timer thread ends right after its fill
                self._refiller = threading.Thread(target=self._refill_loop, name="taskd-spare-refill", daemon=True)
                self._refiller.start()
            self._wake.notify()

    def _refill_loop(self) -> None:
        with self._lock:
            while not self._closed:
                left = None if self._due is None else self._due - time.monotonic()
                if left is None or left > 0:
                    self._wake.wait(60.0 if left is None else left)
                    continue
                self._due = None
                self._fill()

    def _fill(self) -> None:
        while len(self._idle) < self.size:
            try:
                self._idle.append(spawn([sys.executable, "-u", "-c", SPARE_CODE], self._env, cwd=self._cwd,
                                        stdin=subprocess.PIPE))
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("cannot start a warm spare: %s", exc)
                return

    def activate(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes] | None:
        """Hand a rank's argv and environment to an idle spare; None when none is ready."""
        with self._lock:
            return self._activate(argv, env, cwd)

    def _activate(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes] | None:
        if self._script_argv is not None and list(argv[2:]) != self._script_argv:
            log.warning("warm spares run %s, not this rank's %s: the rank starts without one", self._script_argv,
                        list(argv[2:]))
            return None
        while self._idle:
            popen = self._idle.pop(0)
            if has_exited(popen.pid):
                said = _last_words(popen) if self._script_argv is not None else ""
                reap(popen, "warm spare")
                if self._script_argv is not None:
                    log.warning("a warm spare ended (exit code %s) before it was given a rank: with --warm-spare-mode "
                                "script the script must call LiveGroup() or taskd.worker.become_rank() and do nothing "
                                "rank-specific before; its output: %s", popen.returncode, said or "(none)")
                continue
            message = json.dumps({"argv": list(argv[2:]), "env": dict(env), "cwd": cwd}).encode() + b"\n"
            try:
                assert popen.stdin is not None
                popen.stdin.write(message)
                popen.stdin.close()
            except OSError as exc:
                log.debug("warm spare %d unusable: %s", popen.pid, exc)
                kill_group(popen.pid)
                reap(popen, "warm spare")
                continue
            return popen
        return None

    # -- a spare handed a rank before the rank is started (a prepared replacement, taskd.launcher.local) --------
    def bind(self, key: int, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> bool:
        """Hand an idle spare ``key``'s argv and environment now, before the rank is started; `take` adopts it."""
        with self._lock:
            if self._closed or key in self._bound:
                return False
            popen = self._activate(argv, env, cwd)
            if popen is None:
                return False
            self._bound[key] = (popen, dict(env))
            return True

    def bound_pid(self, key: int) -> int | None:
        """The pid of the spare bound to ``key`` (None: none)."""
        with self._lock:
            bound = self._bound.get(key)
            return bound[0].pid if bound is not None else None

    def take(self, key: int, env: Mapping[str, str], ignore: frozenset[str] = PREPARED_MAY_DIFFER) \
            -> subprocess.Popen[bytes] | None:
        """The spare bound to ``key`` if it still runs and was handed ``env`` (but for the ``ignore`` keys), else
        None (a mismatched or dead one is discarded: the caller starts the rank as usual)."""
        with self._lock:
            bound = self._bound.pop(key, None)
        if bound is None:
            return None
        popen, given = bound
        differs = sorted(k for k in set(given) | set(env) if k not in ignore and given.get(k) != env.get(k))
        if not differs and not has_exited(popen.pid):
            return popen
        log.info("prepared replacement %d not used: %s", popen.pid,
                 f"its environment differs in {differs}" if differs else "it ended")
        kill_group(popen.pid)
        reap(popen, "prepared replacement")
        return None

    def discard(self) -> int:
        """Kill and reap every bound spare (a round that starts no replacement for them); the number."""
        with self._lock:
            bound, self._bound = list(self._bound.values()), {}
        for popen, _ in bound:
            kill_group(popen.pid)
        for popen, _ in bound:
            reap(popen, "prepared replacement")
        if bound:
            log.info("live recovery: %d prepared replacement(s) discarded", len(bound))
        return len(bound)

    def ready(self) -> bool:
        """Whether an idle spare is there to bind or activate (one that died meanwhile is found out then)."""
        with self._lock:
            return bool(self._idle) and not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        for popen in self._idle:
            kill_group(popen.pid)
        for popen in self._idle:
            reap(popen, "warm spare")
        self._idle.clear()
        self.discard()

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._idle] + [p.pid for p, _ in self._bound.values()]


def _last_words(popen: subprocess.Popen[bytes], limit: int = 4000) -> str:
    """The end of what an exited spare wrote (at most a pipe's worth is there), for the warning about it."""
    try:
        assert popen.stdout is not None
        os.set_blocking(popen.stdout.fileno(), False)
        data = popen.stdout.read(1 << 16) or b""
    except (OSError, ValueError, AssertionError):
        return ""
    return data.decode(errors="replace").strip()[-limit:]


__all__ = ["SPARE_CODE", "SparePool", "python_script"]
