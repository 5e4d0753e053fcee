"""The test tiers keep their rules: the unit tier's guard catches a process and a socket; tests and bench/ stay apart.

These tests run under tests/unit/conftest.py, so an attempt made here is refused by the live guard.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from tier_guard import RULE, UnitTierViolation, _phase, unit_tier_guard

from taskd.module_map import statements

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]


def test_the_guard_is_live_in_the_unit_tier() -> None:
    """tests/unit/conftest.py wrapped this very test: the process and socket entry points are the guard's."""
    for entry in (subprocess.Popen.__init__, os.fork, socket.socket.connect, grpc.server):
        assert entry.__qualname__.endswith("blocked"), entry


def test_starting_a_subprocess_fails_naming_the_rule() -> None:
    with unit_tier_guard() as seen:
        with pytest.raises(UnitTierViolation, match="tests/unit/ rule: a unit test starts no process") as caught:
            subprocess.run([sys.executable, "-c", "pass"], check=False)
    assert "subprocess.Popen" in str(caught.value)
    assert seen == ["starting a process (subprocess.Popen)"]


def test_fork_and_multiprocessing_fail() -> None:
    with unit_tier_guard() as seen:
        with pytest.raises(UnitTierViolation, match=r"os\.fork"):
            os.fork()
        with pytest.raises(UnitTierViolation, match="multiprocessing"):
            multiprocessing.get_context("spawn").Process(target=print).start()
    assert len(seen) == 2


def test_a_network_socket_fails_and_a_unix_socketpair_does_not() -> None:
    with unit_tier_guard() as seen, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(UnitTierViolation, match=r"network socket \(socket\.connect\)"):
            sock.connect(("127.0.0.1", 9))
        with pytest.raises(UnitTierViolation, match=r"socket\.bind"):
            sock.bind(("127.0.0.1", 0))
        with pytest.raises(UnitTierViolation, match="create_connection"):
            socket.create_connection(("127.0.0.1", 9), timeout=0.1)
        left, right = socket.socketpair()  # AF_UNIX: in-process, what asyncio's event loop needs
        with left, right:
            left.sendall(b"x")
            assert right.recv(1) == b"x"
    assert len(seen) == 3


def test_grpc_servers_and_channels_fail() -> None:
    with unit_tier_guard():
        with pytest.raises(UnitTierViolation, match=r"grpc\.server"):
            grpc.server(None)
        with pytest.raises(UnitTierViolation, match=r"grpc\.insecure_channel"):
            grpc.insecure_channel("127.0.0.1:9")


def test_the_violation_is_not_an_exception_code_under_test_can_swallow() -> None:
    assert not issubclass(UnitTierViolation, Exception)
    with unit_tier_guard():
        try:
            subprocess.Popen(["true"])
        except Exception:  # noqa: BLE001 (the point: this does not catch it)
            pytest.fail("an `except Exception` caught the guard's failure")
        except UnitTierViolation:
            pass


def test_a_violation_the_test_catches_still_fails_it() -> None:
    item = type("Item", (), {"stash": pytest.Stash()})()
    with pytest.raises(UnitTierViolation, match="caught by the test, still a failure"):
        with _phase(item):  # type: ignore[arg-type] (stash is all it reads)
            try:
                subprocess.Popen(["true"])
            except BaseException:  # noqa: BLE001 (a test that swallows everything)
                pass


def test_the_guard_restores_what_it_patched() -> None:
    def entries() -> tuple[object, ...]:
        return subprocess.Popen.__init__, os.fork, socket.socket.connect, grpc.server, "connect" in vars(socket.socket)

    before = entries()
    with unit_tier_guard() as seen:
        assert entries() != before
    assert entries() == before
    assert seen == []
    assert "tests/e2e/" in RULE


_UNIT_TESTS = """
import socket, subprocess

def test_clean():
    assert sum([1, 2]) == 3

def test_spawns():
    subprocess.run(["true"])

def test_connects():
    socket.create_connection(("127.0.0.1", 9), timeout=0.1)

def test_swallows():
    try:
        subprocess.Popen(["true"])
    except BaseException:
        pass
"""


def test_a_unit_tier_run_fails_each_test_that_breaks_the_rule(pytester: pytest.Pytester) -> None:
    """The conftest's hooks in a pytest run of their own (in this process): only the clean test passes, and
    a module that runs a program when imported does not even collect."""
    pytester.makeconftest("from tier_guard import pytest_make_collect_report, pytest_runtest_call, "
                          "pytest_runtest_setup, pytest_runtest_teardown")
    pytester.makepyfile(test_sample=_UNIT_TESTS,
                        test_probe="import subprocess\nPROBE = subprocess.run(['true'])\n\ndef test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, failed=3, errors=1)
    result.stdout.fnmatch_lines_random(["*starting a process (subprocess.Popen)*tests/unit/ rule*",
                                        "*opening a network socket (socket.create_connection)*",
                                        "*caught by the test, still a failure*",
                                        "ERROR test_probe.py*"])


@functools.cache
def _imports(path: Path) -> frozenset[str]:
    """The top-level names `path` imports (`support` for `from support.scripted_agent import ...`); each file
    parsed once for the tests here."""
    names: set[str] = set()
    for node in statements(ast.parse(path.read_text(), filename=str(path)).body):  # imports are statements
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return frozenset(names)


def test_tests_never_reach_into_bench_and_bench_never_into_tests() -> None:
    tests = sorted((ROOT / "tests").rglob("*.py"))
    bench = sorted((ROOT / "bench").glob("*.py"))
    bench_modules = {p.stem for p in bench}
    test_modules = {p.stem for p in tests} | {"support"}
    for path in tests:
        text = path.read_text() if path != Path(__file__).resolve() else ""
        reached = _imports(path) & (bench_modules - test_modules)
        assert not reached, f"{path.relative_to(ROOT)} imports bench/ modules {sorted(reached)}"
        assert "bench/common" not in text and '"bench" / "common' not in text, f"{path} loads bench/common.py"
    for path in bench:
        reached = _imports(path) & (test_modules - bench_modules)
        assert not reached, f"{path.relative_to(ROOT)} imports tests/ modules {sorted(reached)}"


def test_no_test_double_ships_in_the_package() -> None:
    shipped = [p.relative_to(ROOT) for p in (ROOT / "taskd").rglob("*.py")
               if p.stem in {"testing", "scripted_agent", "fakes", "doubles"}]
    assert shipped == []
    for path in (ROOT / "taskd").rglob("*.py"):
        assert not _imports(path) & {"scripted_agent", "support"}, path


def test_no_unit_test_imports_a_test_module() -> None:
    """The unit tier stands alone: what it shares with tests/e2e/ lives in tests/support/, so importing a unit
    test never loads an e2e module (nor, through it, the processes and servers that module's helpers start)."""
    e2e_modules = {p.stem for p in (ROOT / "tests" / "e2e").rglob("*.py")}
    for path in sorted((ROOT / "tests" / "unit").rglob("*.py")):
        reached = {name for name in _imports(path) if name in e2e_modules or name.startswith("test_")}
        assert not reached, (f"{path.relative_to(ROOT)} imports test modules {sorted(reached)}: "
                             "move what it needs to tests/support/")
