"""`--listen` forms (IPv4, IPv6, bare host) and a failed bind that leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, ControllerServer, EmbeddedController, parse_listen
from taskd.controller.status_view import fetch_jobs
from taskd.vocabulary import DEFAULT_PORT

REPO = Path(__file__).resolve().parents[3]


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def open_files_under(path: Path) -> list[str]:
    """Files this process holds open below `path` (a leaked SQLite handle or lock would show here)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        yield blocker.getsockname()[1]


def test_taken_port_fails_naming_the_address_and_creates_no_state(tmp_path: Path, taken_port: int) -> None:
    state = tmp_path / "fresh" / "ctl.sqlite3"
    server = ControllerServer(ControllerConfig(listen=f"127.0.0.1:{taken_port}", state_path=str(state)))
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken_port}"):
        asyncio.run(server.start())
    assert not state.parent.exists()  # bound before the store was opened: no file, no directory, no lock
    assert open_files_under(tmp_path) == []


def test_taskd_server_on_a_taken_port_exits_1_and_leaves_no_state(tmp_path: Path, taken_port: int) -> None:
    state = tmp_path / "ctl.sqlite3"
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{taken_port}",
                           "--state", str(state)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port}" in proc.stderr and "--listen" in proc.stderr
    assert not state.exists() and list(tmp_path.iterdir()) == []


def test_unusable_state_after_the_bind_releases_the_port(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite3"
    junk.write_text("not a database")
    port = free_port()
    with pytest.raises(OSError, match="junk.sqlite3"):
        asyncio.run(ControllerServer(ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(junk))).start())
    assert open_files_under(tmp_path) == []  # the failed store closed its connection
    with EmbeddedController(ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(tmp_path / "ok.sqlite3"))
                            ) as ctl:  # the failed start let go of the port
        assert ctl.address == f"127.0.0.1:{port}"


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("0.0.0.0:8899", ("0.0.0.0", 8899)),
    ("localhost", ("localhost", DEFAULT_PORT)),
    ("ctl-1.example.com:9000", ("ctl-1.example.com", 9000)),
    ("[::1]:0", ("::1", 0)),
    ("[::1]", ("::1", DEFAULT_PORT)),
    ("::1", ("::1", DEFAULT_PORT)),
    ("::", ("::", DEFAULT_PORT)),
    ("fe80::1%eth0", ("fe80::1%eth0", DEFAULT_PORT)),
])
def test_listen_forms(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text,words", [
    ("", "no host"),
    (":8899", "no host"),
    ("host:port", "port 'port'"),
    ("host:70000", "port '70000'"),
    ("[::1", "unclosed ["),
    ("[::1]8899", "text after ]"),
    ("[127.0.0.1]:1", "not an IPv6 address"),
    ("::zz", "not an IPv6 address"),
    ("a host:1", "not a host name"),
    ("http://h:1", "not an IPv6 address"),
    ("h/x:1", "not a host name"),
])
def test_garbage_listen_is_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="bad listen address") as err:
        parse_listen(text)
    assert words in str(err.value) and "HOST:PORT" in str(err.value)
    with pytest.raises(ValueError, match="bad listen address"):
        asyncio.run(ControllerServer(ControllerConfig(listen=text, state_path=":memory:")).start())


def test_taskd_server_rejects_a_garbage_listen_before_doing_anything(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "[::1", "--state", str(state),
                           "--finished-job-retention", "-1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--listen: bad listen address '[::1'" in proc.stderr and "--finished-job-retention" in proc.stderr
    assert not state.exists()


def ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_serves_on_ipv6_loopback() -> None:
    with EmbeddedController(ControllerConfig(listen="[::1]:0", state_path=":memory:")) as ctl:
        assert ctl.address.startswith("[::1]:") and ctl.server is not None and ctl.server.port > 0
        agent = ScriptedAgent(ctl.address, "v6").join()
        try:
            ok(agent.health())
            jobs = fetch_jobs(ctl.address, "v6", timeout=10)  # taskd status's path, MINDX_SERVER_IP form
            assert jobs.status.code == 0 and jobs.jobs[0].agents[0].subscribed
        finally:
            agent.close()
