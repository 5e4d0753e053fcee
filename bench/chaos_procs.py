"""Process helpers of bench/chaos.py: find what a job left behind by reading /proc directly.

A process is the bench's when its environment carries a marker the bench gave the `taskd run` it
started (ranks and anything they start inherit it), or when it sits in the process group of an agent
the bench started. psutil's environ() would do the same, but one pass over /proc is cheaper and sees
stopped processes just as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from taskd.worker.heartbeat_file import HeartbeatFile, HeartbeatFileError


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    return rest[0].decode(), int(rest[1]), int(rest[2])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def tagged(entries: Iterable[str], groups: Iterable[int] = ()) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose environment holds one of `entries` ("KEY=value") exactly, or whose
    process group is one of `groups`; as (pid, command line)."""
    wanted = [b"\0" + e.encode() + b"\0" for e in entries]
    pgids = set(groups)
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        hit = st[2] in pgids
        if not hit and wanted:
            try:
                env = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            hit = any(w in env for w in wanted)
        if hit:
            found.append((pid, cmdline(pid)))
    return found


def is_stopped(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] == "T"


def heartbeating(pid: int) -> bool:
    """Whether a rank has written a heartbeat of its own: only then does its agent judge it for a hang, so only
    then is a SIGSTOP of it a fault the agent can see (one stopped before its first heartbeat hangs for good)."""
    path = environ(pid).get("TASKD_HEARTBEAT_FILE")
    if not path:
        return False
    hb = HeartbeatFile(path)
    try:
        state = hb.read()
    except (HeartbeatFileError, OSError, ValueError):
        return False
    finally:
        hb.close()
    return state.pid == pid and state.time > 0 and not state.section


def step(pid: int) -> int | None:
    """The step a rank last reported in its heartbeat (None before its first, or when it cannot be read)."""
    path = environ(pid).get("TASKD_HEARTBEAT_FILE")
    if not path:
        return None
    hb = HeartbeatFile(path)
    try:
        state = hb.read()
    except (HeartbeatFileError, OSError, ValueError):
        return None
    finally:
        hb.close()
    return state.step if state.pid == pid and state.time > 0 else None
