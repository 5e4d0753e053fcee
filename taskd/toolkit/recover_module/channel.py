"""Controller address parsing and the gRPC channel the client uses."""

from __future__ import annotations

import grpc
import grpc.aio

from taskd.address import join_host_port, parse_host_port
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


ADDRESS_FORMS = "expected HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address"


def normalize_address(server_addr: str, default_port: int = DEFAULT_PORT) -> str:
    """`host`, `host:port`, `[v6]`, `[v6]:port` or a bare `v6` -> a gRPC target with an explicit port.

    A scheme some users paste (http://, dns:///) is dropped. The same parser as `taskd server
    --listen`: what one accepts, the other does.
    """
    addr = (server_addr or "").strip()
    for scheme in ("http://", "https://", "dns:///", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme) :]
    addr = addr.rstrip("/")
    if not addr:
        raise ConfigurationError(f"empty controller address; {ADDRESS_FORMS}")
    try:
        host, port = parse_host_port(addr, default_port, what="controller address", forms=ADDRESS_FORMS)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return join_host_port(host, port)


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
