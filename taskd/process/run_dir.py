"""Private run directories (`taskd-<name>-*`: heartbeat and error files) and the removal of those
that SIGKILLed agents left behind; shared by `taskd run`'s launcher and the agent under msrun.

An agent removes its run directory when it ends, but one killed with SIGKILL (a `taskd run`, or an
msrun with taskd's plugin inside) cannot. So each run directory records its owner (`OWNER_FILE`: the
agent's pid, the process's start time, the host and the PID namespace), and a starting agent removes
the run directories whose owner is dead. Only directories that are safe to judge are touched:
directly in the directory swept, named `taskd-*`, real directories (never a symlink, never followed),
owned by this user, holding an owner file written on this host in this PID namespace. Anything else,
including kept rank-log directories (which have no owner file), is left alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile

log = logging.getLogger(__name__)

PREFIX = "taskd-"
OWNER_FILE = ".taskd-owner.json"
MAX_OWNER_BYTES = 4096


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def owner_record(pid: int | None = None) -> dict[str, object]:
    """Who owns a run directory: this process unless `pid` is given."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": _start_time(pid), "host": socket.gethostname(), "pidns": _pid_namespace()}


def make_run_dir(name: str, tmpdir: str | None = None) -> str:
    """A new private run directory `taskd-<name>-*` in `tmpdir` (default: the temp directory), owned by
    this process; stale ones there are removed first."""
    sweep_stale_run_dirs(tmpdir)
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{name}-", dir=tmpdir)  # mode 0700
    owner = os.path.join(path, OWNER_FILE)
    fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(owner_record(), fh)
    return path


def _read_owner(dir_fd: int) -> dict[str, object] | None:
    try:
        fd = os.open(OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, MAX_OWNER_BYTES).decode())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def owner_alive(owner: dict[str, object]) -> bool:
    """Whether the agent that wrote `owner` still runs (a reused pid with another start time does not)."""
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True  # not ours to judge: keep it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    recorded = owner.get("start")
    return recorded is None or _start_time(pid) in (None, recorded)


def sweep_stale_run_dirs(tmpdir: str | None = None) -> list[str]:
    """Remove this user's run directories whose owning agent is dead (see the module's doc); returns them."""
    root = tmpdir or tempfile.gettempdir()
    here = (socket.gethostname(), _pid_namespace())
    uid = os.getuid()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        log.debug("cannot list %s: %s", root, exc)
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            dir_fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # a symlink fails here
        except OSError:
            continue
        try:
            if os.fstat(dir_fd).st_uid != uid:
                continue
            owner = _read_owner(dir_fd)
        finally:
            os.close(dir_fd)
        if owner is None or (owner.get("host"), owner.get("pidns")) != here or owner_alive(owner):
            continue
        try:
            shutil.rmtree(entry.path)  # fd-based on Linux: symlinks inside are removed, never followed
        except OSError as exc:
            log.warning("cannot remove the stale run directory %s: %s", entry.path, exc)
            continue
        removed.append(entry.path)
    if removed:
        log.info("removed %d run director%s left by agents that died: %s", len(removed),
                 "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed


__all__ = ["OWNER_FILE", "PREFIX", "make_run_dir", "owner_alive", "owner_record", "sweep_stale_run_dirs"]
