"""The tests of tests/e2e/client/test_credentials.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: Client credentials: the token as `authorization: Bearer
<token>` on every call and stream, and TLS/mTLS.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.client import JOB, TOKEN, client

from taskd.client import ClientCredentials, ConfigurationError, RecoverClient
from taskd.proto import recover_pb2


def test_no_variables_means_plain_tcp_and_no_token() -> None:
    creds = ClientCredentials.from_env({})
    assert creds == ClientCredentials() and not creds.tls and creds.metadata() == ()
    assert creds.channel_credentials() is None


def test_token_file_is_read_and_stripped_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    creds = ClientCredentials.from_env({"TASKD_TOKEN_FILE": str(path)})
    assert creds.metadata() == (("authorization", f"Bearer {TOKEN}"),)
    assert TOKEN not in repr(creds) and "token=set" in repr(creds)


@pytest.mark.parametrize(("var", "content", "needle"), [
    ("TASKD_TOKEN_FILE", None, "cannot read it"),
    ("TASKD_TOKEN_FILE", " \n", "empty"),
    ("TASKD_TOKEN_FILE", "two words", "printable ASCII without spaces"),
    ("TASKD_TLS_CA", None, "cannot read it"),
    ("TASKD_TLS_CA", "not a certificate", "not a PEM file"),
])
def test_a_bad_file_names_the_variable_and_the_path(tmp_path: Path, var: str, content: str | None,
                                                    needle: str) -> None:
    path = tmp_path / "file"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigurationError, match=needle) as info:
        ClientCredentials.from_env({var: str(path)})
    assert var in str(info.value) and str(path) in str(info.value)


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="TASKD_TLS_CERT is set but TASKD_TLS_KEY is not"):
        ClientCredentials.from_env({"TASKD_TLS_CERT": str(tmp_path / "cert.pem")})
    with pytest.raises(ConfigurationError, match="private key"):
        ClientCredentials(cert_chain=b"-----BEGIN CERTIFICATE-----")


def test_manager_refuses_a_missing_token_file_at_construction(tmp_path: Path, monkeypatch) -> None:
    missing = tmp_path / "nope"
    monkeypatch.setenv("TASKD_TOKEN_FILE", str(missing))
    with pytest.raises(ConfigurationError, match=f"TASKD_TOKEN_FILE='{missing}'"):
        RecoverClient(recover_pb2.ClientInfo(jobId=JOB), "127.0.0.1")


def test_a_token_over_plain_tcp_to_a_remote_host_is_warned_about(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="taskd.client"):
        client("10.255.255.1:8899", ClientCredentials(token=TOKEN)).stop()
        client("127.0.0.1:8899", ClientCredentials(token=TOKEN)).stop()
    assert caplog.text.count("without TLS") == 1 and "10.255.255.1" in caplog.text
