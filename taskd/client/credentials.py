"""What the client proves to the controller: a bearer token and, optionally, TLS (and a client certificate).

The contract with `taskd server`: the token travels as gRPC metadata `authorization: Bearer <token>`
on every call and on the signal stream; TLS is gRPC's own (`grpc.ssl_channel_credentials`). A
ClusterD-wire client that sends neither keeps working where the server allows it (loopback, or
`--insecure`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from taskd.client.errors import ConfigurationError
from taskd.settings import env_text, setting

# rows of taskd/settings.py (`taskd run`'s --token-file, --tls-*), read with env_text
CREDENTIAL_SETTINGS = ("token_file", "tls_ca", "tls_cert", "tls_key")
TOKEN_FILE_VAR, TLS_CA_VAR, TLS_CERT_VAR, TLS_KEY_VAR = (setting(name).env for name in CREDENTIAL_SETTINGS)
AUTH_HEADER = "authorization"
_PEM = b"-----BEGIN "


def _check_token(token: str, where: str) -> None:
    if not token:
        raise ConfigurationError(f"{where}: the token is empty")
    if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
        raise ConfigurationError(
            f"{where}: the token must be printable ASCII without spaces (it travels as a gRPC metadata value)"
        )


def _read(path: str | os.PathLike[str], where: str, *, pem: bool) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigurationError(f"{where}={os.fspath(path)!r}: cannot read it: {exc.strerror or exc}") from None
    if pem and _PEM not in data:
        raise ConfigurationError(f"{where}={os.fspath(path)!r}: not a PEM file (no '-----BEGIN' line)")
    return data


@dataclass(frozen=True)
class ClientCredentials:
    """A token and TLS material, checked when built. The empty value means: plain TCP, no token.

    `tls` is implied by any certificate; set it alone to use TLS with the system's root CAs.
    """

    token: str | None = field(default=None, repr=False)
    root_ca: bytes | None = field(default=None, repr=False)
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    tls: bool = False

    def __post_init__(self) -> None:
        if self.token is not None:
            if not isinstance(self.token, str):
                raise ConfigurationError(f"token must be a str, got {type(self.token).__name__}")
            _check_token(self.token, "token")
        for name in ("root_ca", "cert_chain", "private_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bytes):
                raise ConfigurationError(f"{name} must be PEM bytes, got {type(value).__name__}")
        if (self.cert_chain is None) != (self.private_key is None):
            raise ConfigurationError("a client certificate needs its private key and the key its certificate")
        if self.root_ca is not None or self.cert_chain is not None:
            object.__setattr__(self, "tls", True)

    def __repr__(self) -> str:  # never the token or the key
        mtls = ", client certificate" if self.cert_chain is not None else ""
        ca = ", own CA" if self.root_ca is not None else ""
        return f"ClientCredentials(token={'set' if self.token else 'none'}, tls={self.tls}{ca}{mtls})"

    @classmethod
    def from_files(
        cls,
        token_file: str | os.PathLike[str] | None = None,
        ca: str | os.PathLike[str] | None = None,
        cert: str | os.PathLike[str] | None = None,
        key: str | os.PathLike[str] | None = None,
        *,
        names: tuple[str, str, str, str] = ("token_file", "ca", "cert", "key"),
    ) -> ClientCredentials:
        """Read the files now; errors name the argument (or, from `from_env`, the variable) and the path."""
        token_name, ca_name, cert_name, key_name = names
        if (cert is None) != (key is None):
            given, missing = (cert_name, key_name) if cert is not None else (key_name, cert_name)
            raise ConfigurationError(f"{given} is set but {missing} is not: a client certificate needs both")
        token = None
        if token_file is not None:
            where = f"{token_name}={os.fspath(token_file)!r}"
            token = _read(token_file, token_name, pem=False).decode("ascii", errors="replace").strip()
            _check_token(token, where)
        return cls(
            token=token,
            root_ca=_read(ca, ca_name, pem=True) if ca is not None else None,
            cert_chain=_read(cert, cert_name, pem=True) if cert is not None else None,
            private_key=_read(key, key_name, pem=True) if key is not None else None,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientCredentials:
        """TASKD_TOKEN_FILE (its content, stripped), TASKD_TLS_CA, TASKD_TLS_CERT, TASKD_TLS_KEY (paths)."""
        names = (TOKEN_FILE_VAR, TLS_CA_VAR, TLS_CERT_VAR, TLS_KEY_VAR)
        paths = [env_text(name, environ) or None for name in CREDENTIAL_SETTINGS]
        return cls.from_files(*paths, names=names)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata carrying the token; empty without one."""
        return ((AUTH_HEADER, f"Bearer {self.token}"),) if self.token else ()

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """gRPC channel credentials for TLS, or None for a plain channel."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_ca, private_key=self.private_key, certificate_chain=self.cert_chain
        )


NO_CREDENTIALS = ClientCredentials()
