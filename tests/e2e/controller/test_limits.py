"""Exhaustion: per-peer calls, connections and streams; the descriptor budget; idle and silent connections.

Each limit is exercised against a real server on loopback, with `limit_loopback` so that this host's
clients count (by default they are exempt: see RELIABILITY.md).
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.scripted_agent import CALL_TIMEOUT, ScriptedAgent, StreamEnded

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, recover_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a channel of its own, not one shared in-process


def serve(**limits: object) -> EmbeddedController:
    return EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", limit_loopback=True,
                                               **limits))


def health(address: str, job: str = "lim") -> grpc.StatusCode:
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as ch:
        try:
            recover_pb2_grpc.RecoverStub(ch).HealthCheck(recover_pb2.ClientInfo(jobId=job), timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert exc.details().startswith("410: ")
            return exc.code()
    return grpc.StatusCode.OK


def test_calls_per_second_per_peer_are_a_token_bucket() -> None:
    with serve(calls_per_second_per_peer=0.001, call_burst_per_peer=3) as ctl:
        codes = [health(ctl.address) for _ in range(6)]
    assert codes == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3


def test_loopback_peers_are_exempt_unless_asked() -> None:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", calls_per_second_per_peer=0.001,
                           call_burst_per_peer=1)
    with EmbeddedController(cfg) as ctl:
        assert {health(ctl.address) for _ in range(5)} == {grpc.StatusCode.OK}


def test_open_streams_per_peer_are_bounded_and_the_first_keeps_working() -> None:
    with serve(max_streams_per_peer=1) as ctl:
        first = ScriptedAgent(ctl.address, "streams", 0, 2).join()
        second = ScriptedAgent(ctl.address, "streams", 1, 2)
        try:
            assert second.register().code == 0
            second.subscribe()
            with pytest.raises(StreamEnded) as err:
                second.next_signal(timeout=CALL_TIMEOUT)
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-streams-per-peer" in err.value.details
            assert first.fault({0: 1}).code == 0
            first.expect("stopTrain")  # the first stream still carries the job's signals
            first.close()  # its slot is free again
            second.subscribe()
            second.expect("stopTrain")
        finally:
            first.close()
            second.close()


def test_connections_with_calls_in_flight_per_peer_are_bounded() -> None:
    with serve(max_connections_per_peer=1) as ctl:
        holder = ScriptedAgent(ctl.address, "conns", 0, 1).join()  # its stream keeps a call in flight
        try:
            holder.next_signal(timeout=CALL_TIMEOUT, keepalive=True)
            assert health(ctl.address, "conns") == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert holder.health().code == 0  # more calls on the same connection are fine
        finally:
            holder.close()
        assert health(ctl.address, "conns") == grpc.StatusCode.OK


@pytest.fixture
def raw_server() -> Iterator[tuple[str, int]]:
    with serve(max_connections=3, handshake_timeout=1.0) as ctl:
        host, port = ctl.address.rsplit(":", 1)
        yield host, int(port)


def test_connections_past_the_budget_are_refused_and_silent_ones_closed(raw_server: tuple[str, int]) -> None:
    socks = [socket.create_connection(raw_server, timeout=CALL_TIMEOUT) for _ in range(5)]
    try:
        for s in socks[3:]:  # past --max-connections: closed before gRPC says a word
            assert s.recv(100) == b""
        for s in socks[:3]:  # accepted (the server's HTTP/2 settings), then closed: no handshake came
            assert s.recv(100) != b""
            while s.recv(100):
                pass
    finally:
        for s in socks:
            s.close()


def test_a_connection_without_a_call_is_closed_after_the_idle_timeout() -> None:
    with serve(idle_timeout=0.5) as ctl:
        with grpc.insecure_channel(ctl.address, options=OWN_CONNECTION) as ch:
            grpc.channel_ready_future(ch).result(timeout=CALL_TIMEOUT)
            idle = threading.Event()
            ch.subscribe(lambda state: state == grpc.ChannelConnectivity.IDLE and idle.set())
            assert idle.wait(CALL_TIMEOUT), "the server did not close the idle connection"
            # the client's next call simply reconnects
            st = recover_pb2_grpc.RecoverStub(ch).HealthCheck(recover_pb2.ClientInfo(jobId="x"), timeout=CALL_TIMEOUT)
            assert st.code == 400


def test_the_open_file_limit_is_raised_to_its_hard_limit(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-file limit is {hard}: nothing to raise")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state",
                             ":memory:"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=low)
    try:
        assert "listening on" in proc.stdout.readline()
        with open(f"/proc/{proc.pid}/limits") as fh:
            line = next(x for x in fh if x.startswith("Max open files"))
        expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        assert line.split()[3] == expected, line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "open-file limit raised from 256" in err and "up to" in err


def test_the_embedded_controller_leaves_the_process_limit_alone() -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    with EmbeddedController():
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == before
