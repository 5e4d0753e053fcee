"""Per-peer limits and the file-descriptor budget: one caller cannot starve the others.

gRPC Python shows a server nothing of a connection until it carries a call, so the limits are taken
per call, by the caller's IP (`context.peer()`): calls per second (a token bucket), connections with a
call in flight (a connection is the peer's `ip:port`), and open signal streams. Connections that never
call are bounded by gRPC itself: the handshake and idle timeouts close them, and
`grpc.max_allowed_incoming_connections` refuses new ones before the descriptors run out.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from taskd.server_settings import server_default

log = logging.getLogger(__name__)

FD_RESERVE_MIN = 64
"""Descriptors kept back from connections: the state file and its journal, logs, the listeners, pipes."""


def raise_nofile() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return hard if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    log.info("open-file limit raised from %d to %d", soft, hard)
    return hard


def connection_budget(nofile: int | None = None) -> int:
    """How many connections gRPC may accept before the descriptors that existing jobs need run out."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    reserve = max(FD_RESERVE_MIN, nofile // 10)
    return max(nofile - reserve, 16)


def peer_ip(peer: str) -> str:
    """`ipv4:1.2.3.4:5678` / `ipv6:[::1]:5678` / `unix:...` -> the address without the port."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return peer


@functools.lru_cache(maxsize=4096)
def _loopback(ip: str) -> bool:
    """Cached: every call of every peer asks it (ipaddress parses in Python)."""
    if ip.startswith("unix:"):
        return True
    try:
        return ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class PeerLimitConfig:
    """Per client IP, `taskd server`'s flags (rows of taskd/server_settings.py); 0 = no limit."""

    max_connections: int = server_default("max_connections_per_peer")
    max_streams: int = server_default("max_streams_per_peer")
    calls_per_second: float = server_default("calls_per_second_per_peer")
    burst: int = server_default("call_burst_per_peer")
    limit_loopback: bool = server_default("limit_loopback")


class _Peer:
    __slots__ = ("tokens", "stamp", "connections", "streams")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.stamp = now
        self.connections: dict[str, int] = {}  # ip:port -> calls in flight on that connection
        self.streams = 0


class PeerLimits:
    """`admit(peer, stream)` -> (refusal or "", release callback). Runs on the server's event loop only."""

    MAX_TRACKED = 100_000  # idle peers are forgotten past this many

    def __init__(self, config: PeerLimitConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._peers: dict[str, _Peer] = {}

    def admit(self, peer: str, stream: bool) -> tuple[str, Callable[[], None] | None]:
        cfg = self.config
        ip = peer_ip(peer)
        if not cfg.limit_loopback and _loopback(ip):
            return "", None
        now = self.clock()
        p = self._peers.get(ip)
        if p is None:
            if len(self._peers) >= self.MAX_TRACKED:
                self._prune(now)
            p = self._peers[ip] = _Peer(cfg.burst, now)
        if cfg.calls_per_second:
            p.tokens = min(cfg.burst, p.tokens + (now - p.stamp) * cfg.calls_per_second)
            p.stamp = now
            if p.tokens < 1:
                return (f"{ip} made more than {cfg.calls_per_second:g} calls per second (burst {cfg.burst}); "
                        "slow down or raise --max-calls-per-second"), None
        if cfg.max_connections and peer not in p.connections and len(p.connections) >= cfg.max_connections:
            return (f"{ip} has {len(p.connections)} connections with calls in flight (limit {cfg.max_connections}, "
                    "--max-connections-per-peer)"), None
        if stream and cfg.max_streams and p.streams >= cfg.max_streams:
            return f"{ip} has {p.streams} open signal streams (limit {cfg.max_streams}, --max-streams-per-peer)", None
        if cfg.calls_per_second:
            p.tokens -= 1
        p.connections[peer] = p.connections.get(peer, 0) + 1
        if stream:
            p.streams += 1

        def release() -> None:
            n = p.connections.get(peer, 0) - 1
            if n > 0:
                p.connections[peer] = n
            else:
                p.connections.pop(peer, None)
            if stream:
                p.streams -= 1

        return "", release

    def _prune(self, now: float) -> None:
        """Forget peers with nothing in flight whose bucket has refilled."""
        cfg = self.config
        full = cfg.burst / cfg.calls_per_second if cfg.calls_per_second else 0.0
        for ip in [ip for ip, p in self._peers.items() if not p.connections and now - p.stamp >= full]:
            del self._peers[ip]
