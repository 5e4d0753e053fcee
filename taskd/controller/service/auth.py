"""Who may call: the admin token or a job credential (`authorization: Bearer <...>`), and gRPC's TLS.

Two kinds of bearer (RELIABILITY.md, "Tenants"):

- the **admin token**, `taskd server --token-file`'s content: every call of every job, the job list,
  and minting job credentials (`taskd token --job ID`);
- a **job credential**, `tdj1.<job id, base64url>.<HMAC-SHA256 of the job id under the admin token>`:
  only the calls that name that job (Init, Register, Subscribe, the reports, HealthCheck, ListJobs of it);
- the **status credential**, `tds1.<HMAC-SHA256 of a fixed label under the admin token>`: `ListJobs` only.
  An embedded controller's locator holds it, so that `taskd status` reads a standalone job and whoever
  else reads the locator (a rank: same user) controls nothing (issue 31, F4).

An HMAC rather than a minted token stored hashed: nothing to store, so a credential survives a
controller restart, a lost state file and a second controller given the same token file, and the
Slurm or Kubernetes job script can mint it before any controller call (`taskd token` needs only the
token file). The price: one job's credential cannot be revoked alone (rotate the admin token: every
credential minted from it stops working). Everything is compared in constant time; a refusal says
what to configure, never a token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import ssl
import time
from collections.abc import Iterable

import grpc

from taskd.controller.config import TOKEN_ENV, ControllerConfig

log = logging.getLogger(__name__)

AUTH_KEY = "authorization"
SCHEME = "bearer"


JOB_PREFIX = "tdj1."
_CONTEXT = b"taskd job credential v1\0"
STATUS_PREFIX = "tds1."
_STATUS_CONTEXT = b"taskd status credential v1\0"
STATUS_READER = "\0status"
"""What `authenticate` names a status credential's bearer by: no job id can be it (ids are printable)."""
STATUS_METHODS = frozenset({"/taskd.v1.JobStatus/ListJobs"})
"""The only calls a status credential may make: reading jobs, as `taskd status` does."""


def status_credential(admin_token: str | bytes) -> str:
    """The read-only credential under `admin_token`: `ListJobs` of every job and nothing else. An embedded
    controller's locator holds it rather than the token its agent calls with (locator.py, issue 31 F4)."""
    key = admin_token.encode() if isinstance(admin_token, str) else admin_token
    return STATUS_PREFIX + hmac.new(key, _STATUS_CONTEXT, hashlib.sha256).hexdigest()


def job_credential(admin_token: str | bytes, job_id: str) -> str:
    """The credential of `job_id` under `admin_token`: printable ASCII, no spaces (a metadata value)."""
    key = admin_token.encode() if isinstance(admin_token, str) else admin_token
    name = base64.urlsafe_b64encode(job_id.encode("utf-8")).decode().rstrip("=")
    mac = hmac.new(key, _CONTEXT + job_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"{JOB_PREFIX}{name}.{mac}"


def credential_job(credential: str, admin_token: bytes) -> str | None:
    """The job a well-formed, genuine job credential is for; None otherwise (constant time on the MAC)."""
    body = credential[len(JOB_PREFIX):]
    name, sep, mac = body.rpartition(".")
    if not sep or not name:
        return None
    try:
        job_id = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    expected = job_credential(admin_token, job_id)
    return job_id if hmac.compare_digest(credential.encode("utf-8", "replace"), expected.encode()) else None


def token_refusal(metadata: Iterable[tuple[str, str | bytes]] | None, token: bytes) -> str:
    """"" if the call carries the admin token or a genuine job credential, else why not (UNAUTHENTICATED)."""
    return authenticate(metadata, token)[0]


def authenticate(metadata: Iterable[tuple[str, str | bytes]] | None, token: bytes) -> tuple[str, str | None]:
    """("", None) for the admin token, ("", job id) for a job credential, ("", STATUS_READER) for the status
    credential, (why not, None) otherwise."""
    sent: str | bytes | None = None
    for key, value in metadata or ():
        if key == AUTH_KEY:
            sent = value
            break
    if sent is None:
        return (f"this controller requires a token and the call sent none: set {TOKEN_ENV} (or --token-file) on "
                f"the client to a file holding the job's credential (`taskd token --job ID`) or the token "
                f"`taskd server --token-file` was given"), None
    if isinstance(sent, bytes):
        sent = sent.decode("latin-1")
    scheme, _, credential = sent.strip().partition(" ")
    if scheme.lower() != SCHEME:
        return f"the {AUTH_KEY} header is not 'Bearer <token>'; set {TOKEN_ENV} (or --token-file) on the client", None
    credential = credential.strip()
    if credential.startswith(JOB_PREFIX):
        job = credential_job(credential, token)
        if job is not None:
            return "", job
        return ("this job credential was not minted from this controller's token: mint it again with `taskd token "
                "--job ID` from the token file `taskd server --token-file` was given"), None
    if credential.startswith(STATUS_PREFIX):
        if hmac.compare_digest(credential.encode("utf-8", "replace"), status_credential(token).encode()):
            return "", STATUS_READER
        return "this status credential was not made from this controller's token", None
    # constant time over the token's bytes: how much of a guess matched is not revealed by timing
    if not hmac.compare_digest(credential.encode("utf-8", "replace"), token):
        return (f"wrong token: the client's {TOKEN_ENV} (or --token-file) must hold the job's credential "
                "(`taskd token --job ID`) or the same token as `taskd server --token-file`"), None
    return "", None


EXPIRY_WARNING_DAYS = 14


def warn_expiry(path: str, flag: str, now: float | None = None) -> str:
    """A warning (logged, and returned) when the first certificate in `path` has expired or expires within
    14 days: clients would refuse the handshake with nothing in this server's log to say why."""
    try:
        cert = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]  # CPython's own PEM decoder
        not_after = ssl.cert_time_to_seconds(cert["notAfter"])
    except Exception:  # not decodable here: gRPC itself says so when it loads the file
        return ""
    left = not_after - (time.time() if now is None else now)
    if left <= 0:
        msg = f"the certificate in {flag} {path} expired on {cert['notAfter']}: clients will refuse the handshake"
    elif left < EXPIRY_WARNING_DAYS * 86400:
        msg = f"the certificate in {flag} {path} expires on {cert['notAfter']} ({left / 86400:.1f} days from now)"
    else:
        return ""
    log.warning(msg)
    return msg


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
    warn_expiry(config.tls_cert, "--tls-cert")
    if config.tls_client_ca is not None:
        warn_expiry(config.tls_client_ca, "--tls-client-ca")
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)
