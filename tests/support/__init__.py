"""Helpers shared by the test modules (tests/ is on sys.path: `from support import wait_for`).

A package: helpers of one area live in a module of it (`support.scripted_agent`, `support.live_files`),
so that a unit test and an e2e test share them without one test module importing another.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from taskd.launcher.spec import free_port  # noqa: F401 (re-exported for the tests)
from taskd.process.tree import rank_pids

ROOT = Path(__file__).resolve().parents[2]  # the repository
EXAMPLES = ROOT / "examples"

ranks_of = rank_pids  # {global rank: pid} of the live rank processes under an agent

WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine

# Processes a test started that must not outlive it even when it fails half-way (conftest.py kills
# whatever is still running here after each test).
STARTED: list = []


def wait_for(pred: Callable[[], object], timeout: float = WAIT, what: str = "condition",
             interval: float = 0.02) -> object:
    """Poll until pred() is truthy and return its value; fail (AssertionError) naming `what` after `timeout` s.

    The tests' own loop, not bench/'s: tests never import bench/ (tests/unit/test_tier_rules.py checks).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


wait_until = wait_for


class ManualClock:
    """A clock the test moves by hand (`clock.now += 5`): the time a unit under test reads, passed in where it
    would call time.monotonic or time.time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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


def secret_file(path: Path, text: str) -> Path:
    """`text` in `path`, readable by its owner only: taskd refuses a token or credential file others can read."""
    path.write_text(text)
    path.chmod(0o600)
    return path


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


def master_args() -> list[str]:
    """A multi-node job's --master-addr/--master-port on a free loopback port: never the default 29500, which a job
    run beside the test (another test, another checkout's suite) may hold."""
    return ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def kill_until_gone(find: Callable[[], list], timeout: float = 30.0) -> None:
    """Teardown: SIGKILL what `find()` returns (psutil.Process objects) until it returns nothing, within `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := find()) and time.monotonic() < deadline:
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=2)
