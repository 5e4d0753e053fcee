"""Where `taskd status` finds the embedded controllers of this user's `taskd run`s (issue 21, D9).

An embedded controller listens on a free loopback port with a random token that only its agent
knows, so `taskd status` could neither find nor read a standalone job. Each one therefore leaves a
locator, `<dir>/<pid>-<port>.json` (address, credential, pid and the process's start time), mode 0600
in a 0700 directory this user owns: `$XDG_RUNTIME_DIR/taskd`, else `~/.taskd/run`. Only this user can
read it, but every process of this user can, the ranks of every standalone job included: so the
credential it holds is the controller's status credential, which reads jobs (`ListJobs`) and nothing
else (auth.status_credential), never the token its agent calls with (issue 31, F4). The locator goes
when the controller stops; one left by a SIGKILLed run names a dead process and is pruned by the
next reader or the next embedded controller.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Locator:
    address: str
    token: str | None
    pid: int
    path: Path


def locator_dir() -> Path:
    """`$XDG_RUNTIME_DIR/taskd` (a login session's private directory), else `~/.taskd/run` (never $TMPDIR: a
    shared directory where another user could have made the name first, and where taskd leaves nothing)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    return Path(runtime) / "taskd" if runtime else Path.home() / ".taskd" / "run"


def _private_dir(create: bool) -> Path | None:
    """The directory, if this user owns it and nobody else can enter it (another user may have made it first)."""
    path = locator_dir()
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            log.debug("no locator directory %s: %s", path, exc)
            return None
    try:
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        log.warning("not using %s for `taskd status` locators: it is not a directory of this user's alone", path)
        return None
    return path


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def write_locator(address: str, token: str | None) -> Path | None:
    """Leave this process's controller where `taskd status` looks; None where it cannot (logged at debug)."""
    folder = _private_dir(create=True)
    if folder is None:
        return None
    live_locators()  # and so the ones SIGKILLed runs left are removed, even where nobody runs `taskd status`
    pid = os.getpid()
    path = folder / f"{pid}-{address.rsplit(':', 1)[-1]}.json"
    data = json.dumps({"address": address, "token": token, "pid": pid, "started": _started(pid)})
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".locator-")  # mode 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("could not write %s: %s", path, exc)
        return None
    return path


def remove_locator(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def live_locators() -> list[Locator]:
    """This user's running embedded controllers on this host, oldest first; dead ones' files are removed."""
    folder = _private_dir(create=False)
    if folder is None:
        return []
    out: list[tuple[float, Locator]] = []
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
            pid, started, address = int(data["pid"]), data.get("started"), str(data["address"])
            token = data.get("token")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        now_started = _started(pid)
        if now_started is None or (started is not None and abs(now_started - float(started)) > 1.0):
            remove_locator(path)  # its process is gone (or the pid was reused)
            continue
        out.append((now_started, Locator(address, token if isinstance(token, str) else None, pid, path)))
    return [loc for _, loc in sorted(out, key=lambda pair: pair[0])]
