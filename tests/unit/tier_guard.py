"""The unit tier's rule as a guard: a test under tests/unit/ starts no process and opens no network socket.

That rule is what keeps `python -m pytest tests/unit` a fast loop that runs anywhere, in parallel with
anything. While a unit test module is imported, and while a unit test's setup, body or teardown runs,
every way this process could start another (subprocess, os.fork and friends, os.posix_spawn,
os.system, multiprocessing) and every way it could reach a network (socket connect/bind/sendto on an
IP socket, gRPC servers and channels) fails the test with a message that names the rule. AF_UNIX
sockets (socketpair, which asyncio's event loop uses for its self-pipe) stay allowed: they never
leave the machine and start nothing.

A test that catches the failure does not escape it: every violation is also recorded and fails the
test after the phase. The guard is a dozen attribute swaps per phase (microseconds).

tests/unit/conftest.py installs the hooks below for the tests under tests/unit/ (pytest calls a
conftest's runtest hooks only for the tests beneath it). The module is also a plugin, for every test
of a run, to check whether a test elsewhere would qualify for the unit tier:
    python -m pytest -p tests.unit.tier_guard tests/test_something.py
"""

from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

RULE = ("tests/unit/ rule: a unit test starts no process and opens no network socket "
        "(put a test that needs one in the end-to-end tier, tests/e2e/)")
NETWORK_FAMILIES = {socket.AF_INET, socket.AF_INET6}


class UnitTierViolation(pytest.fail.Exception):
    """A pytest failure (a BaseException), so an `except Exception` in the code under test cannot swallow it."""


@contextmanager
def unit_tier_guard(violations: list[str] | None = None) -> Iterator[list[str]]:
    """While active, starting a process or using an IP socket raises UnitTierViolation; yields what was tried."""
    seen: list[str] = [] if violations is None else violations
    saved: list[tuple[object, str, Any]] = []

    def refuse(what: str) -> None:
        seen.append(what)
        raise UnitTierViolation(f"{what}: {RULE}", pytrace=True)

    def block(owner: object, name: str, what: str, allow: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        own = vars(owner).get(name)  # None when a class inherits it (socket.socket's C methods)

        def blocked(*args: Any, **kwargs: Any) -> Any:
            if allow is not None and allow(*args, **kwargs):
                return original(*args, **kwargs)
            refuse(what)

        saved.append((owner, name, own))
        setattr(owner, name, blocked)

    def local_socket(sock: socket.socket, *_: Any, **__: Any) -> bool:
        return sock.family not in NETWORK_FAMILIES

    block(subprocess.Popen, "__init__", "starting a process (subprocess.Popen)")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        block(os, name, f"starting a process (os.{name})")
    block(multiprocessing.process.BaseProcess, "start", "starting a process (multiprocessing)")
    block(multiprocessing.util, "spawnv_passfds", "starting a process (multiprocessing's helper processes)")
    for name in ("connect", "connect_ex", "bind", "sendto"):
        block(socket.socket, name, f"opening a network socket (socket.{name})", local_socket)
    block(socket, "create_connection", "opening a network socket (socket.create_connection)")
    _block_grpc(block)
    try:
        yield seen
    finally:
        for owner, name, own in reversed(saved):
            if own is None:
                delattr(owner, name)  # inherited again, as before
            else:
                setattr(owner, name, own)


def _block_grpc(block: Callable[..., None]) -> None:
    """gRPC opens its sockets in C, below the socket module: refuse its servers and channels themselves."""
    try:
        import grpc
        import grpc.aio
    except ImportError:
        return
    for module in (grpc, grpc.aio):
        for name in ("server", "insecure_channel", "secure_channel"):
            block(module, name, f"opening a network socket ({module.__name__}.{name})")


# ----------------------------------------------------------------------------- the hooks

_VIOLATIONS = pytest.StashKey[list[str]]()


@contextmanager
def _phase(item: pytest.Item) -> Iterator[None]:
    """One phase (setup, call, teardown) under the guard; a violation the test swallowed still fails it."""
    violations: list[str] = item.stash.setdefault(_VIOLATIONS, [])
    before = len(violations)
    with unit_tier_guard(violations):
        yield
    if len(violations) > before:  # reached only when the phase itself raised nothing: the test caught it
        raise UnitTierViolation(f"{violations[before]} (caught by the test, still a failure): {RULE}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    """Importing a test module (a module-level probe that runs a program, say) obeys the rule too."""
    if not isinstance(collector, pytest.Module):
        return (yield)
    with unit_tier_guard():
        return (yield)
