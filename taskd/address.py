"""`host[:port]` as users type it, parsed once for the controller (`--listen`) and its clients.

One parser, so that `taskd server --listen X` and `taskd run --server X` / `MINDX_SERVER_IP=X`
accept the same forms and refuse the same mistakes (a bare IPv6 literal has colons but no port).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def parse_host_port(text: str, default_port: int, *, what: str, forms: str, port_zero: bool = False
                    ) -> tuple[str, int]:
    """`host:port`, `[v6]:port`, `[v6]`, a bare `v6` or a bare `host` -> (host without brackets, port).

    ValueError says what is wrong, as "bad <what> '<text>': <problem>; <forms>". Port 0 ("any free
    port") only makes sense for a listener, hence `port_zero`.
    """
    raw = text.strip()
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad {what} {text!r}: unclosed [ or text after ]; {forms}")
        port_text = rest[1:] if rest else str(default_port)
        bracketed = True
    elif raw.count(":") > 1:
        host, port_text, bracketed = raw, str(default_port), True
    else:
        host, _, port_text = raw.partition(":") if ":" in raw else (raw, "", str(default_port))
        bracketed = False
    if not host:
        raise ValueError(f"bad {what} {text!r}: no host; {forms}")
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            problem = "is not an IPv6 address" if raw.startswith("[") else "has several ':' but is not an IPv6 address"
            raise ValueError(f"bad {what} {text!r}: {host!r} {problem}; {forms}") from None
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(f"bad {what} {text!r}: {host!r} is not a host name or IP address; {forms}")
    lowest = 0 if port_zero else 1
    if not port_text.isdigit() or not lowest <= int(port_text) <= 65535:
        raise ValueError(f"bad {what} {text!r}: port {port_text!r} is not {lowest}-65535; {forms}")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """The gRPC / MINDX_SERVER_IP form: an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


CONTROLLER_FORMS = "expected HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address"
DEFAULT_CONTROLLER_PORT = 8899  # taskd.vocabulary.DEFAULT_PORT; ClusterD's


def controller_target(text: str, default_port: int = DEFAULT_CONTROLLER_PORT) -> str:
    """A controller address as users type it (`--server`, MINDX_SERVER_IP, `taskd status --server`) -> a gRPC
    target with an explicit port; ValueError saying what is wrong. A scheme users paste (http://, dns:///) is
    dropped."""
    addr = (text or "").strip()
    for scheme in ("http://", "https://", "dns:///", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
    addr = addr.rstrip("/")
    if not addr:
        raise ValueError(f"empty controller address; {CONTROLLER_FORMS}")
    host, port = parse_host_port(addr, default_port, what="controller address", forms=CONTROLLER_FORMS)
    return join_host_port(host, port)


# TaskD's LOCAL_PROXY_ENABLE (its Go GetClusterdAddr and its Python init_grpc_recover_manager): "on" means every
# connection to the controller goes to the node's local proxy at 127.0.0.1:8899, whatever MINDX_SERVER_IP says.
LOCAL_PROXY_ENV = "LOCAL_PROXY_ENABLE"
LOCAL_PROXY_ADDRESS = f"127.0.0.1:{DEFAULT_CONTROLLER_PORT}"


def local_proxy_enabled(env: Mapping[str, str]) -> bool:
    """TaskD compares the value with "on" exactly; so does this."""
    return env.get(LOCAL_PROXY_ENV) == "on"
