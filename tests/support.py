"""Helpers shared by the test modules (tests/ is on sys.path: `from support import wait_for`)."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable
from pathlib import Path

import psutil

from taskd.launcher.spec import free_port  # noqa: F401 (re-exported for the tests)


def _load_bench_common():  # noqa: ANN202 (a module)
    """bench/common.py, by path: bench/ is a directory of scripts, not a package the tests can import."""
    path = Path(__file__).resolve().parent.parent / "bench" / "common.py"
    spec = importlib.util.spec_from_file_location("bench_common", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bench = _load_bench_common()
ranks_of = _bench.rank_pids  # {global rank: pid} of the live rank processes under an agent

WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine

# Processes a test started that must not outlive it even when it fails half-way (conftest.py kills
# whatever is still running here after each test).
STARTED: list = []


def wait_for(pred: Callable[[], object], timeout: float = WAIT, what: str = "condition",
             interval: float = 0.02) -> object:
    """Poll until pred() is truthy and return its value; fail naming `what` after `timeout` seconds.

    The benchmarks' loop with the tests' defaults; its TimeoutError becomes a test failure (AssertionError).
    """
    try:
        return _bench.wait_for(pred, timeout, what, interval)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


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
