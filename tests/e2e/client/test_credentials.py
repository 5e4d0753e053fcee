"""Client credentials: the token as `authorization: Bearer <token>` on every call and stream, and TLS/mTLS.

The server here is a real grpc.server on loopback port 0 with an interceptor that checks the
metadata exactly as `taskd server` does (the contract in taskd/client/credentials.py); the TLS
certificates are made by the test with the `cryptography` package.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from support import wait_until
from support.client import JOB, TOKEN, WAIT, Recorder, client

from taskd.client import AuthenticationError, ClientCredentials, RecoverClient, ServerUnreachable
from taskd.client.manager import DLRecoverManager
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2_grpc


class TokenCheck(grpc.ServerInterceptor):
    """Records (method, authorization header) of every call; refuses a missing or wrong token."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}"
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str | None]] = []

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token; set TASKD_TOKEN_FILE")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        header = dict(handler_call_details.invocation_metadata).get("authorization")
        with self.lock:
            self.seen.append((handler_call_details.method.rsplit("/", 1)[-1], header))
        return continuation(handler_call_details) if header == self.expected else self._deny


def start_server(recorder: Recorder, *, interceptor: TokenCheck | None = None,
                 server_credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[interceptor] if interceptor else [],
                         options=[("grpc.http2.min_ping_interval_without_data_ms", 1000),
                                  ("grpc.keepalive_permit_without_calls", 1)])
    recover_pb2_grpc.add_RecoverServicer_to_server(recorder, server)
    taskd_pb2_grpc.add_AgentReportServicer_to_server(recorder, server)
    if server_credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", server_credentials)
    server.start()
    return server, port


def subscribe_once(mgr: RecoverClient) -> None:
    thread = threading.Thread(target=mgr.start_subscribe, daemon=True)
    thread.start()
    try:
        wait_until(lambda: mgr.connected, what="subscribed")
    finally:
        mgr.stop()
        thread.join(WAIT)
    assert not thread.is_alive()


# -- building credentials ------------------------------------------------------------------------


# -- the token on the wire -----------------------------------------------------------------------


@pytest.fixture
def guarded():
    recorder, check = Recorder(), TokenCheck(TOKEN)
    server, port = start_server(recorder, interceptor=check)
    yield f"127.0.0.1:{port}", recorder, check
    recorder.end_streams()
    server.stop(grace=0).wait(WAIT)


def test_the_token_travels_on_every_call_and_on_the_stream(guarded) -> None:
    address, recorder, check = guarded
    mgr = client(address, ClientCredentials(token=TOKEN))
    assert mgr.init_clusterd() and mgr.register().code == 0
    assert mgr.health_check().code == 0
    assert mgr.report_process_fault({1: 1}) == 0
    assert mgr.report_finished(0, "done") == 0  # taskd's own AgentReport service
    subscribe_once(mgr)
    methods = [method for method, _ in check.seen]
    assert methods == ["Init", "Register", "HealthCheck", "ReportProcessFault", "ReportFinished",
                       "SubscribeProcessManageSignal"]
    assert {header for _, header in check.seen} == {f"Bearer {TOKEN}"}
    assert recorder.names() == ["Init", "Register", "HealthCheck", "ReportProcessFault", "ReportFinished",
                                "Subscribe"]


def test_the_manager_reads_its_token_from_the_environment_by_default(guarded, tmp_path, monkeypatch) -> None:
    address, _, check = guarded
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("TASKD_TOKEN_FILE", str(token_file))
    DLRecoverManager.reset_instance()
    try:
        mgr = DLRecoverManager(recover_pb2.ClientInfo(jobId=JOB), address)
        assert mgr.register().code == 0
    finally:
        DLRecoverManager.reset_instance()
    assert check.seen == [("Register", f"Bearer {TOKEN}")]


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_missing_or_wrong_token_is_an_authentication_error_not_unreachable(guarded, token, caplog) -> None:
    address, recorder, _ = guarded
    mgr = client(address, ClientCredentials(token=token))
    try:
        with pytest.raises(AuthenticationError, match="TASKD_TOKEN_FILE") as info:
            mgr.register()
        assert not isinstance(info.value, ServerUnreachable)
        with pytest.raises(AuthenticationError):
            mgr.init_clusterd()  # not retried for two minutes: retrying cannot fix a token
        with pytest.raises(AuthenticationError):
            mgr.report_process_fault({0: 1})
    finally:
        mgr.stop()
    assert recorder.names() == []  # the interceptor stopped every call


# -- TLS and mutual TLS --------------------------------------------------------------------------

def _pki_with_cryptography(root: Path) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer=None, issuer_key=None, *, ca: bool = False, server: bool = False):
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        if not ca:
            usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("taskd test CA", ca_key, ca=True)
    out = {"ca": root / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        out[role], out[f"{role}_key"] = root / f"{role}.pem", root / f"{role}_key.pem"
        out[role].write_bytes(cert(f"taskd test {role}", key, ca.subject, ca_key, server=role == "server")
                              .public_bytes(serialization.Encoding.PEM))
        out[f"{role}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return out


def _pki_with_openssl(root: Path) -> dict[str, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=root)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-days", "1", "-subj", "/CN=taskd test CA", "-keyout", "ca_key.pem", "-out", "ca.pem")
    extensions = {"server": "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
                  "client": "extendedKeyUsage=clientAuth\n"}
    for role, ext in extensions.items():
        (root / f"{role}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        run("req", *ec, "-subj", f"/CN=taskd test {role}", "-keyout", f"{role}_key.pem", "-out", f"{role}.csr")
        run("x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca_key.pem", "-CAcreateserial",
            "-days", "1", "-extfile", f"{role}.ext", "-out", f"{role}.pem")
    return {name: root / f"{name}.pem" for name in ("ca", "server", "server_key", "client", "client_key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    root = tmp_path_factory.mktemp("pki")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available to make certificates")
        return _pki_with_openssl(root)
    return _pki_with_cryptography(root)


@pytest.fixture
def mtls_server(pki):
    recorder, check = Recorder(), TokenCheck(TOKEN)
    credentials = grpc.ssl_server_credentials([(pki["server_key"].read_bytes(), pki["server"].read_bytes())],
                                              root_certificates=pki["ca"].read_bytes(), require_client_auth=True)
    server, port = start_server(recorder, interceptor=check, server_credentials=credentials)
    yield f"127.0.0.1:{port}", recorder, check
    recorder.end_streams()
    server.stop(grace=0).wait(WAIT)


def test_mutual_tls_with_a_token_from_the_environment(mtls_server, pki, tmp_path) -> None:
    address, recorder, check = mtls_server
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    creds = ClientCredentials.from_env({"TASKD_TOKEN_FILE": str(token_file), "TASKD_TLS_CA": str(pki["ca"]),
                                        "TASKD_TLS_CERT": str(pki["client"]), "TASKD_TLS_KEY": str(pki["client_key"])})
    assert creds.tls
    mgr = client(address, creds)
    assert mgr.register().code == 0 and mgr.report_process_fault({0: 1}) == 0
    subscribe_once(mgr)  # the stream's own grpc.aio channel uses the same TLS and token
    assert recorder.names() == ["Register", "ReportProcessFault", "Subscribe"]
    assert {header for _, header in check.seen} == {f"Bearer {TOKEN}"}


def test_without_a_client_certificate_or_with_plain_tcp_the_tls_server_is_not_reached(mtls_server, pki) -> None:
    address, recorder, _ = mtls_server
    no_cert = client(address, ClientCredentials(token=TOKEN, root_ca=pki["ca"].read_bytes()), call_timeout=1.0)
    plain = client(address, ClientCredentials(token=TOKEN), call_timeout=1.0)
    try:
        for mgr in (no_cert, plain):
            with pytest.raises(ServerUnreachable):
                mgr.register()
    finally:
        no_cert.stop()
        plain.stop()
    assert recorder.names() == []


def test_taskd_positional_secure_conn_and_cert_path_still_mean_tls_with_that_ca(pki) -> None:
    recorder = Recorder()
    credentials = grpc.ssl_server_credentials([(pki["server_key"].read_bytes(), pki["server"].read_bytes())])
    server, port = start_server(recorder, server_credentials=credentials)
    try:
        mgr = RecoverClient(recover_pb2.ClientInfo(jobId=JOB), f"127.0.0.1:{port}", True, str(pki["ca"]),
                            credentials=ClientCredentials(), call_timeout=5.0)
        assert mgr.credentials.tls and mgr.register().code == 0
        mgr.stop()
    finally:
        server.stop(grace=0).wait(WAIT)
    assert recorder.names() == ["Register"]
