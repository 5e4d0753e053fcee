"""Helpers shared by the test modules (tests/ is on sys.path: `from support import wait_for`)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import psutil

WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine

# Processes a test started that must not outlive it even when it fails half-way (conftest.py kills
# whatever is still running here after each test).
STARTED: list = []


def wait_for(pred: Callable[[], object], timeout: float = WAIT, what: str = "condition",
             interval: float = 0.02) -> object:
    """Poll until pred() is truthy and return its value; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


wait_until = wait_for


def written(path, timeout: float = WAIT) -> str:  # noqa: ANN001 (a Path)
    """The text another process writes into `path`, once there is some.

    Waiting for the name alone races the writer: open(..., "w") creates the file empty a moment
    before the write lands, so a reader can see "" (CI failed on exactly that, twice).
    """
    def text() -> str:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return ""

    return str(wait_for(text, timeout, f"{path} to be written"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def leftovers(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line mentions `marker`."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in proc.info["cmdline"] or []):
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def ranks_of(agent_pid: int) -> dict[int, int]:
    """{global rank: pid} of the live Python rank processes under an agent (found by their RANK variable)."""
    found = {}
    try:
        children = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            env = child.environ()
            if "RANK" in env and child.status() != psutil.STATUS_ZOMBIE and "python" in child.name():
                found[int(env["RANK"])] = child.pid
        except psutil.Error:
            continue
    return found
