"""Who may call: the shared token (`authorization: Bearer <token>`) and gRPC's own TLS credentials.

The token is compared in constant time. A refusal says what to configure, never the token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import grpc

from taskd.controller.config import TOKEN_ENV, ControllerConfig

AUTH_KEY = "authorization"
SCHEME = "bearer"


def token_refusal(metadata: Iterable[tuple[str, str | bytes]] | None, token: bytes) -> str:
    """"" if the call's metadata carries `token`, else why not (for UNAUTHENTICATED)."""
    sent: str | bytes | None = None
    for key, value in metadata or ():
        if key == AUTH_KEY:
            sent = value
            break
    if sent is None:
        return (f"this controller requires a token and the call sent none: set {TOKEN_ENV} (or --token-file) on "
                f"the client to a file holding the token `taskd server --token-file` was given")
    if isinstance(sent, bytes):
        sent = sent.decode("latin-1")
    scheme, _, credential = sent.strip().partition(" ")
    if scheme.lower() != SCHEME:
        return f"the {AUTH_KEY} header is not 'Bearer <token>'; set {TOKEN_ENV} (or --token-file) on the client"
    # constant time over the token's bytes: how much of a guess matched is not revealed by timing
    if not hmac.compare_digest(credential.strip().encode("utf-8", "replace"), token):
        return (f"wrong token: the client's {TOKEN_ENV} (or --token-file) must hold the same token as "
                "`taskd server --token-file`")
    return ""


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def server_credentials(config: ControllerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for --tls-cert/--tls-key (None: plaintext); --tls-client-ca makes client certificates
    signed by that CA mandatory (mTLS). OSError naming the file that cannot be read."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    try:
        pair = (_read(config.tls_key), _read(config.tls_cert))
        client_ca = _read(config.tls_client_ca) if config.tls_client_ca is not None else None
    except OSError as exc:
        raise OSError(f"cannot read a TLS file: {exc} (--tls-cert, --tls-key, --tls-client-ca)") from exc
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)
