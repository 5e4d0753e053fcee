"""`ControllerConfig`: everything `taskd server` can be told, checked where it is built.

The CLI only maps flags to fields; `EmbeddedController(ControllerConfig(...))` is refused for the same
values, with the same words, as `taskd server` is. Each problem names the field and its flag.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import stat
from dataclasses import dataclass, field, fields
from typing import Any

from taskd.address import parse_host_port
from taskd.controller.machine.state_machine import MachineConfig
from taskd.server_settings import FLAGS, TOKEN_ENV, server_default
from taskd.vocabulary import DEFAULT_PORT

log = logging.getLogger(__name__)

MAX_MESSAGE = 4 * 1024 * 1024
"""Largest request the controller accepts, as ClusterD (gRPC's own default)."""
MAX_STREAMS_PER_CONNECTION = 1024
"""HTTP/2 streams open at once on one connection. An agent uses two (its signal stream and a call), but
gRPC shares one connection between the channels of a process that dial the same target, so a process
hosting many agents (tests, simulators) needs many; 32 stalled a 40-agent test. With the 16 KB window
and unauthenticated calls refused on their headers it still bounds what one connection can make the
server buffer (measured: under 1 KB per refused stream)."""
STREAM_WINDOW = 16 * 1024
"""Bytes a stream may send before the server reads them (gRPC's lookahead; BDP probing, which grows it
towards megabytes, is off): requests are a few hundred bytes, and a 4 MB one just takes more round trips."""
MAX_SEND_MESSAGE = 64 * 1024 * 1024
"""Largest answer: one job's status page may be bigger than a request ever is."""
LISTEN_FORMS = "expected HOST:PORT, [IPV6]:PORT, a bare IPv6 address or a bare HOST (port 0 = any free port)"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
MIN_TOKEN_LENGTH = 16
TOKEN_HINT = f"e.g. `openssl rand -hex 32 > token; chmod 600 token`, then --token-file token (or {TOKEN_ENV}=token)"
RANK_LIMIT = 2**31 - 1
"""Rank ids and world sizes fit a signed 32-bit integer (the wire's int32, SQLite, every framework)."""


class ConfigError(ValueError):
    """A `ControllerConfig` that cannot serve; `problems` lists one line per bad field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_listen(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """`host:port`, `[v6]:port`, `[v6]`, a bare `v6` or a bare `host` -> (host without brackets, port);
    ValueError saying what is wrong otherwise (0.0.0.0:PORT serves every interface)."""
    return parse_host_port(text, default_port, what="listen address", forms=LISTEN_FORMS, port_zero=True)


def is_loopback(host: str) -> bool:
    """Only this host can reach `host` (127.0.0.0/8, ::1, localhost); a wildcard or a name is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def read_token(path: str) -> str:
    """The token in `path` (surrounding whitespace dropped); ValueError saying what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read(65536).strip()
        mode = os.stat(path).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path!r}: {exc}") from None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the token in {path!r} has {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}; "
                         + TOKEN_HINT)
    if why := token_problem(token):
        raise ValueError(f"the token in {path!r} {why}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s can be read by other users (mode %o): chmod 600 it", path, mode & 0o777)
    return token


def token_problem(token: str) -> str:
    """"" for a token that travels in an HTTP/2 header as is (visible ASCII, no spaces)."""
    if not all("!" <= c <= "~" for c in token):
        return "has characters other than visible ASCII (no spaces, no control characters)"
    return ""


METRICS_PORT = 9464  # where --metrics-listen serves without a port (the OpenTelemetry Prometheus exporter's)


def problem(name: str, what: str) -> str:
    """"--stop-timeout must be > 0, got 0 (ControllerConfig.stop_timeout)": the flag a `taskd server` user
    types, and the field an `EmbeddedController` caller sets. `what` starts with its separator."""
    flag = FLAGS.get(name)
    return f"{flag}{what} (ControllerConfig.{name})" if flag else f"ControllerConfig.{name}{what}"


@dataclass(frozen=True)
class ControllerConfig(MachineConfig):
    """Everything `taskd server` can be told; the CLI only parses flags into this. The recovery
    timeouts and policy defaults are `MachineConfig`'s fields, inherited rather than repeated.
    Construction raises `ConfigError` naming every bad field and its flag."""

    listen: str = server_default("listen")
    state_path: str | None = server_default("state_path")  # None = default_state_path(); ":memory:" keeps nothing
    keepalive_interval: float = server_default("keepalive_interval")
    # HTTP/2 PINGs the server sends on a connection it has heard nothing on for `agent_ping_interval`; one not
    # answered within `agent_ping_timeout` closes the connection, which ends its signal streams (then
    # --agent-loss-grace). What finds a SIGSTOPped or partitioned agent: its kernel still ACKs TCP, but its
    # gRPC cannot answer a PING. A busy agent answers (gRPC's own threads, not Python's, answer PINGs).
    # Bound: interval + timeout + grace after the agent's last word (docs/controller.md, "A lost node").
    agent_ping_interval: float = server_default("agent_ping_interval")
    agent_ping_timeout: float = server_default("agent_ping_timeout")
    max_jobs: int = server_default("max_jobs")
    # a finished (SUCCEEDED/FAILED) job with no agent streaming or calling for this long is forgotten,
    # in memory and in the state file; a full table evicts the longest idle finished job early
    finished_job_retention: float = server_default("finished_job_retention")
    subscriber_queue_size: int = server_default("subscriber_queue_size")
    # Calls gRPC core has received but the event loop has not picked up yet: above the soft limit some
    # are refused, above the hard limit all (defaults 1000/3000), and one left waiting longer than
    # `max_unrequested_seconds` (default 30) is cancelled. The agent sees CANCELLED for all three (grpcio
    # 1.71, checked with a blocked loop). A controller restart makes every agent reconnect at once
    # (one call in flight per agent), so keep the limits above the agent count and let a queued call
    # wait rather than be cancelled and retried after a backoff.
    max_pending_requests: int = server_default("max_pending_requests")
    max_pending_requests_hard_limit: int = server_default("max_pending_requests_hard_limit")
    max_unrequested_seconds: int = server_default("max_unrequested_seconds")
    grace: float = server_default("grace")
    extra_options: list[tuple[str, Any]] = field(default_factory=list)
    # --- who may call (RELIABILITY.md, "Threat model")
    token_file: str | None = server_default("token_file")
    # the token itself, for a caller that made it (the embedded controller's per-run token): never logged
    token: str | None = field(default=None, repr=False)
    tls_cert: str | None = server_default("tls_cert")
    tls_key: str | None = server_default("tls_key")
    tls_client_ca: str | None = server_default("tls_client_ca")  # mTLS: clients present a certificate it signed
    # serve a non-loopback address without a token (ClusterD-wire clients send none)
    insecure: bool = server_default("insecure")
    # --- bounds on what callers may ask for
    max_node_count: int = server_default("max_node_count")
    # ranks of one job; what bounds the rank ids and list sizes of a job whose Init gives no ranksPerNode
    # (ClusterD-wire clients): above the largest jobs run today, small enough that one report stays < 1 MB
    max_ranks: int = server_default("max_ranks")
    # bytes one job may hold in the state file (its snapshot and history); a change past it is refused 413 and
    # nothing changes (controller/storage/quota.py). 0 = no quota
    max_job_bytes: int = server_default("max_job_bytes")
    # history log lines per job every 10 s (the rest counted in its next line); 0 = no limit
    max_job_log_lines: int = server_default("max_job_log_lines")
    # --- per peer IP (loopback peers are exempt unless limit_loopback: see RELIABILITY.md); 0 = no limit
    max_connections_per_peer: int = server_default("max_connections_per_peer")  # connections with a call in flight
    max_streams_per_peer: int = server_default("max_streams_per_peer")  # open signal streams
    calls_per_second_per_peer: float = server_default("calls_per_second_per_peer")  # token bucket refill
    call_burst_per_peer: int = server_default("call_burst_per_peer")  # token bucket size
    limit_loopback: bool = server_default("limit_loopback")
    idle_timeout: float = server_default("idle_timeout")  # an HTTP/2 connection without a call this long is closed
    # a TCP connection that has not finished its HTTP/2 (or TLS) handshake
    handshake_timeout: float = server_default("handshake_timeout")
    # a connection that carried no call with the token this long after it opened is closed (0 = never);
    # connections without one also go first when a peer is past max_connections_per_peer
    auth_timeout: float = server_default("auth_timeout")
    # None: RLIMIT_NOFILE minus a reserve for the state file and logs
    max_connections: int | None = server_default("max_connections")
    # connections one credential (a job's, or the admin token) holds, idle or not (None: a quarter of
    # max_connections; 0 = no bound): one tenant never holds every slot (controller/service/tenancy.py)
    max_connections_per_credential: int | None = server_default("max_connections_per_credential")
    # --- Prometheus metrics (controller/metrics.py, the [metrics] extra): HOST:PORT, None = off
    metrics_listen: str | None = server_default("metrics_listen")

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    def problems(self) -> list[str]:
        """Every bad field, as "<flag> <what is wrong> (ControllerConfig.<field>)"."""
        out: list[str] = []

        def bad(name: str, what: str) -> None:
            out.append(problem(name, what if what.startswith((" ", ":")) else f": {what}"))

        try:
            host, _ = parse_listen(self.listen)
        except (ValueError, AttributeError) as exc:
            bad("listen", str(exc))
            host = ""
        for name in ("keepalive_interval", "stop_timeout", "strategy_timeout", "recover_timeout", "resume_timeout",
                     "agent_loss_timeout", "agent_loss_grace", "node_rejoin_timeout", "join_timeout", "grace",
                     "idle_timeout", "handshake_timeout", "agent_ping_interval", "agent_ping_timeout",
                     "unregistered_job_timeout"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                bad(name, f" must be > 0, got {getattr(self, name)!r}")
        for name in ("settle_window", "finished_job_retention", "last_call_timeout", "calls_per_second_per_peer",
                     "auth_timeout"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                bad(name, f" must be >= 0, got {getattr(self, name)!r}")
        for name in ("max_jobs", "subscriber_queue_size", "max_pending_requests", "max_pending_requests_hard_limit",
                     "max_unrequested_seconds"):
            if not _int(getattr(self, name)) or getattr(self, name) <= 0:
                bad(name, f" must be an integer > 0, got {getattr(self, name)!r}")
        for name in ("default_max_restarts", "max_standbys", "max_connections_per_peer", "max_streams_per_peer",
                     "call_burst_per_peer", "max_job_bytes", "max_job_log_lines"):
            if not _int(getattr(self, name)) or getattr(self, name) < 0:
                bad(name, f" must be an integer >= 0, got {getattr(self, name)!r}")
        if not _int(self.max_node_count) or not 1 <= self.max_node_count <= RANK_LIMIT:
            bad("max_node_count", f" must be an integer 1-{RANK_LIMIT}, got {self.max_node_count!r}")
        if not _int(self.max_ranks) or not 1 <= self.max_ranks <= RANK_LIMIT:
            bad("max_ranks", f" must be an integer 1-{RANK_LIMIT}, got {self.max_ranks!r}")
        if self.max_connections is not None and (not _int(self.max_connections) or self.max_connections < 1):
            bad("max_connections", f" must be an integer > 0 (or unset), got {self.max_connections!r}")
        if self.max_connections_per_credential is not None and (
                not _int(self.max_connections_per_credential) or self.max_connections_per_credential < 0):
            bad("max_connections_per_credential",
                f" must be an integer >= 0 (or unset), got {self.max_connections_per_credential!r}")
        if self.calls_per_second_per_peer and _int(self.call_burst_per_peer) and self.call_burst_per_peer < 1:
            bad("call_burst_per_peer", " must be >= 1 when calls per second are limited")
        self._auth_problems(host, bad)
        if self.metrics_listen is not None:
            try:
                parse_listen(self.metrics_listen, METRICS_PORT)
            except (ValueError, AttributeError) as exc:
                bad("metrics_listen", str(exc))
            if importlib.util.find_spec("prometheus_client") is None:
                bad("metrics_listen", "needs prometheus_client: pip install 'taskd[metrics]'")
        return out

    def _auth_problems(self, host: str, bad: Any) -> None:
        if self.token is not None and self.token_file is not None:
            bad("token", "give the token or token_file, not both")
        if self.token is not None:
            if len(self.token) < MIN_TOKEN_LENGTH:
                bad("token", f"has fewer than {MIN_TOKEN_LENGTH} characters")  # the token itself is never shown
            elif why := token_problem(self.token):
                bad("token", why)
        if self.token_file is not None:
            try:
                read_token(self.token_file)
            except ValueError as exc:
                bad("token_file", str(exc))
        if (self.tls_cert is None) != (self.tls_key is None):
            bad("tls_cert" if self.tls_cert is None else "tls_key", "--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            bad("tls_client_ca", "requiring client certificates needs TLS: give --tls-cert and --tls-key too")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None and not os.access(path, os.R_OK):
                bad(name, f"cannot read {path!r}")
        authenticated = self.token is not None or self.token_file is not None or self.tls_client_ca is not None
        if host and not is_loopback(host) and not authenticated and not self.insecure:
            bad("listen", f"{self.listen!r} can be reached from other hosts and no token is set: anyone who can "
                          f"reach it could read, fail or stop every job. Give --token-file PATH ({TOKEN_HINT}; "
                          f"clients read {TOKEN_ENV}), or --tls-client-ca for client certificates, or --insecure "
                          "on a network you trust")

    # ------------------------------------------------------------------ derived

    def load_token(self) -> str | None:
        """The token every call must carry (None: calls are not authenticated)."""
        if self.token is not None:
            return self.token
        return read_token(self.token_file) if self.token_file is not None else None

    def machine_config(self) -> MachineConfig:
        """Only the state machine's part (what each `JobMachine` holds)."""
        return MachineConfig(**{f.name: getattr(self, f.name) for f in fields(MachineConfig)})

    def grpc_options(self, max_connections: int | None = None) -> list[tuple[str, Any]]:
        opts: list[tuple[str, Any]] = [
            ("grpc.server.max_pending_requests", self.max_pending_requests),
            ("grpc.server.max_pending_requests_hard_limit", self.max_pending_requests_hard_limit),
            ("grpc.server_max_unrequested_time_in_server", self.max_unrequested_seconds),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            # what a connection can make the server buffer before a call is read (RELIABILITY.md, N3)
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", STREAM_WINDOW),
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE),
            # clients ping every few seconds even without calls: allow it instead of GOAWAY(too_many_pings)
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
            # and find dead or stopped agents' connections ourselves: a PING after `agent_ping_interval` of
            # silence (a live client's own 3 s pings count as activity, so it is rarely sent), unanswered for
            # `agent_ping_timeout` -> the connection closes. grpcio 1.85 times a PING out by
            # http2.ping_timeout_ms (default 60 s), not by keepalive_timeout_ms alone: both are set (measured)
            ("grpc.keepalive_time_ms", _ms(self.agent_ping_interval)),
            ("grpc.keepalive_timeout_ms", _ms(self.agent_ping_timeout)),
            ("grpc.http2.ping_timeout_ms", _ms(self.agent_ping_timeout)),
            ("grpc.so_reuseport", 0),
            # a connection that never finishes its handshake, or that carries no call for long, is closed
            # (a client's channel reconnects by itself on its next call); no max_connection_age: it would
            # cut every agent's long-lived signal stream
            ("grpc.server_handshake_timeout_ms", int(self.handshake_timeout * 1000)),
            ("grpc.max_connection_idle_ms", int(self.idle_timeout * 1000)),
        ]

        if max_connections is not None:
            opts.append(("grpc.max_allowed_incoming_connections", max_connections))
        return [*opts, *self.extra_options]


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
