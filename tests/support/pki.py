"""Certificates for TLS tests, made here for 127.0.0.1 (a test skips when the cryptography package is missing)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer: str, issuer_key, *, ca: bool = False, server: bool = False):  # noqa: ANN001, ANN202
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert=None, key=None) -> str:  # noqa: ANN001
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
    return str(path)


def make_pki(d: Path) -> dict[str, str]:
    """ca, server cert/key (127.0.0.1, localhost), a client cert/key signed by the CA, one by a stranger CA,
    as PEM files in `d` (tests take them through the `pki` fixture of tests/conftest.py)."""
    ca_key, other_key = _key(), _key()
    ca = _cert("taskd test CA", ca_key, "taskd test CA", ca_key, ca=True)
    other = _cert("stranger CA", other_key, "stranger CA", other_key, ca=True)
    server_key, client_key, stranger_key = _key(), _key(), _key()
    return {
        "ca": _write(d / "ca.pem", ca),
        "server_cert": _write(d / "server.pem", _cert("localhost", server_key, "taskd test CA", ca_key, server=True)),
        "server_key": _write(d / "server.key", key=server_key),
        "client_cert": _write(d / "client.pem", _cert("agent", client_key, "taskd test CA", ca_key)),
        "client_key": _write(d / "client.key", key=client_key),
        "stranger_cert": _write(d / "stranger.pem", _cert("mallory", stranger_key, "stranger CA", other_key)),
        "stranger_key": _write(d / "stranger.key", key=stranger_key),
        "other_ca": _write(d / "other_ca.pem", other),
    }
