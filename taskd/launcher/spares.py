"""Warm spares: Python interpreters started ahead of time that become a rank when one is needed.

A restarted rank spends most of its first ~35 ms starting a Python interpreter. A spare has
already done that: it waits on its stdin for the rank's environment and argv, then runs the
script with `runpy.run_path(..., run_name="__main__")`, as `python -u script.py` would (same
interpreter, `sys.argv`, `sys.path[0]` = the script's directory, `__name__ == "__main__"`,
exit code 1 and a traceback on an exception). Only for `.py` entrypoints; opt-in
(`taskd run --warm-spares N`). With TASKD_PREIMPORT (set to `torch` for live-recovery jobs) a spare
imports those modules first (`taskd.worker.live.preimport`), so a replacement skips torch's import.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence

from taskd.process.spawn import has_exited, kill_group, reap, spawn

log = logging.getLogger(__name__)

# Runs in the spare (`python -u -c`): nothing but the stdlib, nothing imported that the script
# would not expect, nothing left behind in the namespace the script runs in.
SPARE_CODE = r"""
import json, os, sys
if os.environ.get("TASKD_PREIMPORT"):  # e.g. torch: the replacement then joins in ms, not after a 1.5 s import
    from taskd.worker.live import preimport as _preimport
    _preimport()
    del _preimport
_line = sys.stdin.buffer.readline()
if not _line:
    sys.exit(0)
_msg = json.loads(_line)
_fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(_fd, 0)
os.close(_fd)
os.environ.clear()
os.environ.update(_msg["env"])
sys.argv = _msg["argv"]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
if _msg.get("cwd"):
    os.chdir(_msg["cwd"])
del _line, _msg, _fd
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def python_script(entrypoint: Sequence[str]) -> str | None:
    """The script of a `[sys.executable, "-u", script.py, ...]` entrypoint, else None (no spares)."""
    if len(entrypoint) >= 3 and entrypoint[0] == sys.executable and entrypoint[1] == "-u" \
            and entrypoint[2].endswith(".py"):
        return entrypoint[2]
    return None


class SparePool:
    """Idle interpreters owned by the launcher; spawned and activated from the launcher's callers' thread."""

    def __init__(self, size: int, env: Mapping[str, str], cwd: str | None) -> None:
        self.size = max(0, size)
        self._env = dict(env)
        self._cwd = cwd
        self._idle: list[subprocess.Popen[bytes]] = []

    def fill(self) -> None:
        while len(self._idle) < self.size:
            try:
                self._idle.append(spawn([sys.executable, "-u", "-c", SPARE_CODE], self._env, cwd=self._cwd,
                                        stdin=subprocess.PIPE))
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("cannot start a warm spare: %s", exc)
                return

    def activate(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes] | None:
        """Hand a rank's argv and environment to an idle spare; None when none is ready."""
        while self._idle:
            popen = self._idle.pop(0)
            if has_exited(popen.pid):
                reap(popen, "warm spare")
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

    def close(self) -> None:
        for popen in self._idle:
            kill_group(popen.pid)
        for popen in self._idle:
            reap(popen, "warm spare")
        self._idle.clear()

    def pids(self) -> list[int]:
        return [p.pid for p in self._idle]


__all__ = ["SPARE_CODE", "SparePool", "python_script"]
