"""TLS and mTLS with gRPC's own credentials; the certificates are made here, for 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.status_view import fetch_jobs, read_credentials
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2_grpc


def secure(agent: ScriptedAgent, credentials: grpc.ChannelCredentials) -> ScriptedAgent:
    agent.channel.close()
    agent.channel = grpc.secure_channel(agent.address, credentials)
    agent.stub = recover_pb2_grpc.RecoverStub(agent.channel)
    agent.reports = taskd_pb2_grpc.AgentReportStub(agent.channel)
    agent.status_stub = taskd_pb2_grpc.JobStatusStub(agent.channel)
    return agent


def creds(pki: dict[str, str], ca: str = "ca", cert: str | None = None) -> grpc.ChannelCredentials:
    _, c = read_credentials(None, pki[ca], pki[f"{cert}_cert"] if cert else None, pki[f"{cert}_key"] if cert else None)
    assert c is not None
    return c


def refused(agent: ScriptedAgent) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        agent.stub.Init(agent.info, timeout=5)
    agent.close()
    return err.value.code()


@pytest.fixture(scope="module")
def tls_server(pki) -> Iterator[str]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", tls_cert=pki["server_cert"],
                           tls_key=pki["server_key"])
    with EmbeddedController(cfg) as ctl:
        yield ctl.address


@pytest.fixture(scope="module")
def mtls_server(pki) -> Iterator[str]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", tls_cert=pki["server_cert"],
                           tls_key=pki["server_key"], tls_client_ca=pki["ca"])
    with EmbeddedController(cfg) as ctl:
        yield ctl.address


def test_tls_serves_a_client_that_trusts_its_ca(pki, tls_server: str) -> None:
    agent = secure(ScriptedAgent(tls_server, "tls", 0, 1), creds(pki)).join()
    try:
        assert agent.health().code == 0
    finally:
        agent.close()
    jobs = fetch_jobs(tls_server, credentials=creds(pki), timeout=10)  # taskd status --tls-ca
    assert [j.jobId for j in jobs.jobs] == ["tls"]


def test_tls_refuses_plaintext_and_a_client_trusting_another_ca(pki, tls_server: str) -> None:
    assert refused(ScriptedAgent(tls_server, "tls", 0, 1)) == grpc.StatusCode.UNAVAILABLE
    assert refused(secure(ScriptedAgent(tls_server, "tls", 0, 1), creds(pki, ca="other_ca"))) \
        == grpc.StatusCode.UNAVAILABLE


def test_mtls_requires_a_client_certificate_signed_by_the_client_ca(pki, mtls_server: str) -> None:
    assert refused(secure(ScriptedAgent(mtls_server, "m", 0, 1), creds(pki))) == grpc.StatusCode.UNAVAILABLE
    assert refused(secure(ScriptedAgent(mtls_server, "m", 0, 1), creds(pki, cert="stranger"))) \
        == grpc.StatusCode.UNAVAILABLE
    agent = secure(ScriptedAgent(mtls_server, "m", 0, 1), creds(pki, cert="client")).join()
    try:
        assert agent.health().code == 0
    finally:
        agent.close()


def test_plaintext_connections_to_a_tls_server_log_rate_limited_lines_and_tell_the_client(pki, tmp_path) -> None:
    """Issue 19 N6 and the misleading hint: 40 plaintext connections to `taskd server --tls-cert` give at most
    a couple of gRPC "Handshake failed" lines and a count of the rest; a plaintext taskd client is told that
    something closed its connection (TLS or a limit), not to check whether a server runs there."""
    import socket
    import subprocess
    import sys

    from support import STARTED, free_port, port_open, wait_for

    from taskd.client.errors import ServerUnreachable
    from taskd.client.rpc import translate

    port = free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state",
                             ":memory:", "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"]],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=Path(__file__).resolve().parents[3])
    STARTED.append(proc)
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as err:
                recover_pb2_grpc.RecoverStub(ch).HealthCheck(recover_pb2.ClientInfo(jobId="x"), timeout=5)
        error = translate(err.value, "HealthCheck", f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    shown = text.count("Handshake failed") + text.count("handshake failed")
    assert 1 <= shown <= 3, text[-3000:]
    assert "were not shown (rate-limited)" in text or "more like it" in text, text[-3000:]
    assert isinstance(error, ServerUnreachable) and "TASKD_TLS_CA" in str(error), str(error)
    assert "expires on" in text  # the test certificate is valid for a day: the start warns about it
