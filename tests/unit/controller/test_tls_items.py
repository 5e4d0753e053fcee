"""Issue 19 item 5: the expired-certificate warning at start and the hint for a connection closed on accept."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from taskd.client.errors import ServerUnreachable, unreachable_hint
from taskd.controller.service.auth import warn_expiry

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def cert_file(path: Path, days: float) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctl")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=400))
            .not_valid_after(now + datetime.timedelta(days=days)).sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_an_expired_certificate_is_warned_about_naming_the_flag(tmp_path: Path, caplog) -> None:
    with caplog.at_level("WARNING"):
        msg = warn_expiry(cert_file(tmp_path / "old.pem", -3), "--tls-cert")
    assert "expired on" in msg and "--tls-cert" in msg and "old.pem" in msg
    assert msg in caplog.text


def test_a_certificate_about_to_expire_is_warned_about_and_a_valid_one_is_not(tmp_path: Path) -> None:
    assert "days from now" in warn_expiry(cert_file(tmp_path / "soon.pem", 3), "--tls-cert")
    assert warn_expiry(cert_file(tmp_path / "fine.pem", 300), "--tls-cert") == ""
    assert warn_expiry(str(tmp_path / "missing.pem"), "--tls-cert") == ""


def test_a_connection_closed_on_accept_is_not_called_a_missing_server() -> None:
    closed = str(ServerUnreachable("ctl:8899", "Init: UNAVAILABLE: ipv4:10.0.0.1:8899: Socket closed"))
    assert "TASKD_TLS_CA" in closed and "connection limit" in closed and "is `taskd server` running" not in closed
    refused = unreachable_hint("failed to connect to all addresses; last error: UNKNOWN: Connection refused")
    assert "is `taskd server` running there?" in refused
