"""Peers that never authenticate are bounded before they do (issue 19, N2/N3), against a real `taskd server`.

The attacker speaks raw HTTP/2 (bench/h2probe.py) from 127.0.0.2, the legitimate client gRPC from
127.0.0.1, so that the per-IP limits (applied to loopback with --limit-loopback) tell them apart.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import STARTED, free_port, port_open, secret_file, wait_for

from taskd.proto import recover_pb2, recover_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "a-token-for-tests-0123456789abcdef"
MB = 2**20


def _probe():  # noqa: ANN202 (a module)
    spec = importlib.util.spec_from_file_location("h2probe", ROOT / "bench" / "h2probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["h2probe"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


h2 = _probe()


class Server:
    def __init__(self, tmp_path: Path, *flags: str) -> None:
        token = secret_file(tmp_path / "token", TOKEN)
        self.port = free_port()
        self.log = tmp_path / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{self.port}", "--state", ":memory:",
             "--token-file", str(token), "--limit-loopback", *flags],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
        STARTED.append(self.proc)
        wait_for(lambda: port_open(self.port), 30, "taskd server to listen")

    def legit_init(self, job: str) -> int:
        """A legitimate client's Init on a connection of its own: the Status code, or raises grpc.RpcError."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            st = recover_pb2_grpc.RecoverStub(ch).Init(
                recover_pb2.ClientInfo(jobId=job, nodeCount=1, ranksPerNode=1), timeout=10,
                metadata=(("authorization", f"Bearer {TOKEN}"),))
        return st.code

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def test_unauthenticated_4mb_messages_leave_server_memory_bounded(tmp_path: Path, servers: list[Server]) -> None:
    """30 connections x 70 streams to /Recover/Init, each declaring 4 MB, no token: each call is refused on
    its headers, before its body is buffered; the server's peak RSS grows by well under one message per
    stream (8.2 GB declared), and a legitimate client is served throughout."""
    srv = Server(tmp_path, "--auth-timeout", "60")
    servers.append(srv)
    assert srv.legit_init("warm") == 0
    base = h2.rss_bytes(srv.proc.pid)
    conns = [h2.RawConnection.open("127.0.0.1", srv.port, source="127.0.0.2") for _ in range(30)]
    try:
        h2.pump_all(conns, 0.3)
        for c in conns:
            for _ in range(70):
                c.call("/Recover/Init", 4 * MB)
            c.fill()
        for round_ in range(3):
            h2.pump_all(conns, 1.0)
            for c in conns:
                c.fill()
                c.trickle()
            assert srv.legit_init(f"legit-{round_}") == 0
        peak = h2.hwm_bytes(srv.proc.pid)
        sent = sum(c.sent_data for c in conns)
        answered = sum(s.closed for c in conns for s in c.streams.values())
    finally:
        for c in conns:
            c.close()
    assert answered == 30 * 70, "every stream was refused on its headers (UNAUTHENTICATED)"
    assert sent < 30 * 70 * 64 * 1024, f"the windows let {sent / MB:.0f} MB in"
    assert peak - base < 64 * MB, f"RSS {base / MB:.0f} MB -> peak {peak / MB:.0f} MB"
    assert "requires a token and the call sent none" in srv.text() and "Traceback" not in srv.text()


def test_idle_connections_past_the_peer_budget_are_closed_and_do_not_lock_a_client_out(
        tmp_path: Path, servers: list[Server]) -> None:
    """40 HTTP/2 connections from one IP that send the preface and SETTINGS and never call, against a per-peer
    budget of 10 and a total budget of 30: the watch closes the excess within a scan, logs which limit it
    hit, and a legitimate client from another address Inits at once."""
    srv = Server(tmp_path, "--max-connections-per-peer", "10", "--max-connections", "30", "--auth-timeout", "60")
    servers.append(srv)
    conns = []
    for _ in range(40):
        try:
            conns.append(h2.RawConnection.open("127.0.0.1", srv.port, source="127.0.0.2"))
        except OSError:
            break
    try:
        def survivors() -> int:
            h2.pump_all(conns, 0.2)
            return sum(not c.closed for c in conns)

        wait_for(lambda: survivors() <= 10, 15, "the watch to close the idle connections past the peer budget")
        started = time.monotonic()
        assert srv.legit_init("after-idle-flood") == 0
        assert time.monotonic() - started < 5
    finally:
        for c in conns:
            c.close()
    log = srv.text()
    assert "sent no authenticated call, from 127.0.0.2" in log and "--max-connections-per-peer" in log


def test_a_connection_that_never_authenticates_is_closed_and_one_that_did_is_kept(
        tmp_path: Path, servers: list[Server]) -> None:
    srv = Server(tmp_path, "--auth-timeout", "1")
    servers.append(srv)
    stranger = h2.RawConnection.open("127.0.0.1", srv.port, source="127.0.0.2")
    wrong = h2.RawConnection.open("127.0.0.1", srv.port, source="127.0.0.2")
    h2.pump_all([stranger, wrong], 0.3)
    wrong.call("/Recover/HealthCheck", 0, [("authorization", "Bearer not-the-token-at-all-000000")])
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}", options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        stub = recover_pb2_grpc.RecoverStub(ch)
        md = (("authorization", f"Bearer {TOKEN}"),)
        assert stub.Init(recover_pb2.ClientInfo(jobId="kept", nodeCount=1, ranksPerNode=1), timeout=10,
                         metadata=md).code == 0
        states: list[grpc.ChannelConnectivity] = []
        ch.subscribe(states.append)
        wait_for(lambda: (h2.pump_all([stranger, wrong], 0.2), stranger.closed and wrong.closed)[1], 15,
                 "the server to close the connections without an authenticated call")
        time.sleep(1.5)  # past the auth timeout once more: the client's connection must still be the same one
        assert grpc.ChannelConnectivity.IDLE not in states[1:], states
        assert stub.HealthCheck(recover_pb2.ClientInfo(jobId="kept"), timeout=10, metadata=md).code == 400
    assert "--auth-timeout" in srv.text()
