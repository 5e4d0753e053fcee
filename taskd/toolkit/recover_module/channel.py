"""Controller address parsing and the gRPC channel the client uses."""

from __future__ import annotations

import grpc
import grpc.aio

from taskd.toolkit.recover_module.errors import ConfigurationError
from taskd.vocabulary import DEFAULT_PORT

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

ChannelOptions = list[tuple[str, int | str]] | tuple[tuple[str, int | str], ...]

# Keepalive pings detect a dead controller or a dropped NAT entry within seconds even while
# the signal stream is idle; the reconnect backoff is capped so that an agent finds a
# restarted controller quickly (gRPC's default cap is two minutes).
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 3000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 3000),
)


def normalize_address(server_addr: str, default_port: int = DEFAULT_PORT) -> str:
    """`host`, `host:port`, `[v6]` or `[v6]:port` -> a gRPC target with an explicit port."""
    addr = (server_addr or "").strip()
    for scheme in ("http://", "https://", "dns:///", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme) :]
    addr = addr.rstrip("/")
    if not addr:
        raise ConfigurationError("empty controller address; expected host or host:port")
    if addr.startswith("["):
        host, sep, rest = addr[1:].partition("]")
        if not sep or not host or (rest and not rest.startswith(":")):
            raise ConfigurationError(f"bad controller address {server_addr!r}; expected [ipv6]:port")
        port_text = rest[1:] if rest else str(default_port)
        host = f"[{host}]"
    elif addr.count(":") == 1:
        host, port_text = addr.split(":")
    elif addr.count(":") > 1:  # a bare IPv6 address
        host, port_text = f"[{addr}]", str(default_port)
    else:
        host, port_text = addr, str(default_port)
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigurationError(f"bad controller address {server_addr!r}; expected host or host:port")
    return f"{host}:{int(port_text)}"


def make_channel(
    target: str,
    extra_options: ChannelOptions = (),
    credentials: grpc.ChannelCredentials | None = None,
    *,
    aio: bool = False,
) -> grpc.Channel | grpc.aio.Channel:
    """A channel with the default options; `extra_options` override entries of the same name.

    `aio=True` gives the grpc.aio twin (same options and credentials); create it on the loop that uses it.
    """
    options: dict[str, int | str] = dict(DEFAULT_CHANNEL_OPTIONS)
    options.update(dict(extra_options))
    module = grpc.aio if aio else grpc
    if credentials is not None:
        return module.secure_channel(target, credentials, options=list(options.items()))
    return module.insecure_channel(target, options=list(options.items()))
