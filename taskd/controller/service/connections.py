"""Connections that never authenticate: counted per client IP, idle ones included, and closed.

gRPC Python shows a server nothing of a connection until it carries a call, and has no per-IP
connection limit: a peer could open `--max-connections` HTTP/2 connections that never call and lock
every new client out until the idle timeout (RELIABILITY.md, "N2"). So the kernel is asked instead for
the established connections to the listening port (netlink sock_diag, else `/proc/net/tcp` and `tcp6`),
every `interval` seconds. The guard tells which connections carried an authenticated call; one that did
not is closed (`shutdown(2)` on a duplicate of gRPC's descriptor, found in `/proc/self/fd`) when

- it is older than `auth_timeout` (a legitimate client calls within milliseconds of connecting);
- its IP holds more than `max_per_peer` connections (idle ones count), the oldest unauthenticated first;
- all connections together pass `soft_budget`, oldest unauthenticated first, so new clients find room.

A connection that authenticated is bound to its credential (tenancy.py) and, when idle, closed when its
credential is past `--max-connections-per-credential`, its IP past `max_per_peer` (after the unauthenticated
ones), or the server past `soft_budget` and its tenant above its fair share; one with a call in flight never
is. Each closing is logged, rate-limited, with the limit that was hit. Linux only (as the launcher is):
elsewhere the watch does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from taskd.controller.service import sockdiag
from taskd.controller.service.tenancy import FAIR_SLACK, Link, Tenants, describe, over_cap, over_fair, over_peer
from taskd.server_settings import server_default

log = logging.getLogger(__name__)

ESTABLISHED = "01"
NO_BOUND = 0  # a budget of 0 bounds nothing: a watch built without one (tests); server.py computes both budgets
# The scans' pace, a mechanism's constants rather than knobs: a never-authenticating connection is seen within a
# second of its auth timeout, and a flood of early scans (credentials at their cap) costs at most five a second.
SCAN_INTERVAL = 1.0
MIN_SCAN_GAP = 0.2


@dataclass(frozen=True)
class WatchConfig:
    port: int
    auth_timeout: float = server_default("auth_timeout")  # 0 = never close for that
    max_per_peer: int = server_default("max_connections_per_peer")  # 0 = no per-IP bound
    soft_budget: int = NO_BOUND  # past it, idle connections are closed (server.py: 90% of `budget`)
    budget: int = NO_BOUND  # gRPC's own cap (grpc.max_allowed_incoming_connections): at it, new connections are refused
    limit_loopback: bool = server_default("limit_loopback")  # loopback peers count against max_per_peer
    interval: float = SCAN_INTERVAL
    min_interval: float = MIN_SCAN_GAP  # a scan asked for early (a credential at its cap) comes no sooner


@dataclass
class _Conn:
    inode: int
    ip: str
    port: int
    seen: float  # first seen by a scan
    authenticated: bool = False


@dataclass(frozen=True)
class _Verdict:
    doomed: dict[int, str]  # inode -> which limit: "auth", "peer" or "budget"; "peer-idle", "credential", "fair"
    ips: dict[int, str]  # inode -> client ip, of the doomed ones
    per_ip: dict[str, int]  # every client ip's open connections at the scan
    total: int
    creds: dict[int, str]  # inode -> credential, of the doomed authenticated ones


@functools.lru_cache(maxsize=4096)
def _hex_ip(text: str) -> str:
    """Cached: a scan of 10,000 connections from a few hosts parses the same few addresses 10,000 times
    (holding the GIL the event loop needs)."""
    raw = bytes.fromhex(text)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


@functools.lru_cache(maxsize=4096)
def normal_ip(ip: str) -> str:
    """`::ffff:1.2.3.4` -> `1.2.3.4`; other addresses unchanged (what `context.peer()` and the table agree on).
    Cached: every authenticated call asks it for its peer."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def established(port: int, tables: tuple[str, ...] | None = None) -> dict[int, tuple[str, int]]:
    """{socket inode: (client ip, client port)} of the established connections whose local port is `port`:
    asked of the kernel over netlink (sockdiag.py: only this port's connections, in binary), else read from
    `tables` (the kernel's text tables of every socket on the host)."""
    if tables is None:
        found = sockdiag.established(port)
        if found is not None:
            return found
        tables = TABLES
    suffix = f":{port:04X}"
    out: dict[int, tuple[str, int]] = {}
    for table in tables:
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) < 10 or not parts[1].endswith(suffix) or parts[3] != ESTABLISHED:
                        continue
                    rip, _, rport = parts[2].partition(":")
                    out[int(parts[9])] = (_hex_ip(rip), int(rport, 16))
        except OSError:
            continue
    return out


def close_sockets(inodes: set[int]) -> int:
    """shutdown(2) this process's sockets with these inodes; gRPC then sees the end and frees its side."""
    done = 0
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for name in names:
        if not inodes:
            break
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        inode = int(link[8:-1])
        if inode not in inodes:
            continue
        try:
            dup = os.dup(int(name))
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino != inode:  # the descriptor was closed and reused meanwhile
                continue
            sock = socket.socket(fileno=dup)
            dup = -1
            try:
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
                inodes.discard(inode)
            except OSError:
                pass
            finally:
                sock.close()
        finally:
            if dup >= 0:
                os.close(dup)
    return done


def _ips(ips: dict[str, int], shown: int = 5) -> str:
    """"10.0.0.1 (3), 10.0.0.2 (1) and 4 more addresses": a bounded line however many peers there are."""
    top = sorted(ips.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{ip} ({n})" for ip, n in top[:shown])
    return text + (f" and {len(top) - shown} more addresses" if len(top) > shown else "")


@functools.lru_cache(maxsize=4096)
def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


class ConnectionWatch:
    """`authenticated(peer)` from the guard; `scan()` every interval (run() on the server's loop)."""

    def __init__(self, config: WatchConfig, note: Callable[..., object] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 table: Callable[[int], dict[int, tuple[str, int]]] = established,
                 closer: Callable[[set[int]], int] = close_sockets, cap: int = 0,
                 fair: Callable[[str], int] = lambda credential: FAIR_SLACK) -> None:
        """`cap`: connections one credential may hold (0 = no bound); `fair(credential)`: its fair share."""
        self.config = config
        self.clock = clock
        self._table = table
        self._closer = closer
        self._note = note or (lambda kind, msg, *args: log.warning(msg, *args))
        self._conns: dict[int, _Conn] = {}
        self._fair = fair
        self._wake: asyncio.Event | None = None
        self.tenants = Tenants(cap, clock, normal_ip, self.poke)
        self.closed_total = 0

    def poke(self) -> None:
        """Scan soon (a credential's connection is to be closed); on the loop, or before run() started."""
        if self._wake is not None:
            self._wake.set()

    def authenticated(self, peer: str, credential: str | None = None) -> None:
        """A call from `peer` (`ipv4:1.2.3.4:5678`) passed the token check and ended: its connection is a
        client's (`credential`'s). The guard goes through `tenants.admit` instead, which may refuse."""
        _, release = self.tenants.admit(peer, credential)
        if release is not None:
            release()

    def open_connections(self, ip: str) -> int:
        """Connections of `ip` at the last scan, authenticated or not."""
        ip = normal_ip(ip)
        return sum(1 for c in self._conns.values() if c.ip == ip)

    def scan(self) -> int:
        """Read the table, mark the proven connections, close what must go; returns how many were closed."""
        before = self.clock()
        verdict = self._decide(self._table(self.config.port), before)
        return self._close(verdict, self._closer(set(verdict.doomed))) if verdict.doomed else 0

    def _decide(self, current: dict[int, tuple[str, int]], before: float) -> _Verdict:
        """Which connections must go, and by which limit; runs on the loop (it shares `tenants` with the guard).
        `before`: when `current` was read."""
        cfg, now, links = self.config, self.clock(), self.tenants.links
        conns: dict[int, _Conn] = {}
        for inode, (ip, port) in current.items():
            c = self._conns.get(inode) or _Conn(inode, ip, port, now)
            if (ip, port) in links:
                c.authenticated = True
            conns[inode] = c
        self._conns = conns
        self.tenants.forget({(c.ip, c.port) for c in conns.values()}, before)
        doomed: dict[int, str] = {}  # inode -> which limit: "auth", "peer" or "budget"
        suspects = sorted((c for c in conns.values() if not c.authenticated), key=lambda c: c.seen)
        if cfg.auth_timeout:
            for c in suspects:
                if now - c.seen >= cfg.auth_timeout:
                    doomed[c.inode] = "auth"
        per_ip: dict[str, int] = {}
        for c in conns.values():
            per_ip[c.ip] = per_ip.get(c.ip, 0) + 1
        if cfg.max_per_peer:
            left_ip = {ip: n - sum(1 for i in doomed if conns[i].ip == ip) for ip, n in per_ip.items()
                       if n > cfg.max_per_peer}
            for c in suspects:
                n = left_ip.get(c.ip, 0)
                if c.inode in doomed or n <= cfg.max_per_peer or (_loopback(c.ip) and not cfg.limit_loopback):
                    continue
                doomed[c.inode] = "peer"
                left_ip[c.ip] = n - 1
        total = len(conns)
        if cfg.soft_budget:
            left = total - len(doomed)
            for c in suspects:
                if left <= cfg.soft_budget:
                    break
                if c.inode not in doomed:
                    doomed[c.inode] = "budget"
                    left -= 1
        self._tenant_limits(conns, doomed, per_ip)
        if cfg.budget and total >= cfg.budget:
            self._note("conn:full", "%d connections open, at the budget of %d (--max-connections): gRPC closes new "
                       "ones as they arrive", total, cfg.budget)
        creds = {i: lk.credential or "" for i in doomed if (lk := links.get((conns[i].ip, conns[i].port)))}
        return _Verdict(doomed, {i: conns[i].ip for i in doomed}, per_ip, total, creds)

    def _tenant_limits(self, conns: dict[int, _Conn], doomed: dict[int, str], per_ip: dict[str, int]) -> None:
        """Idle authenticated connections past their IP's bound, their credential's cap, or (the server past its
        soft budget) their tenant's fair share join `doomed`, in that order (tenancy.py)."""
        cfg, links = self.config, self.tenants.links
        inode_of = {(c.ip, c.port): c.inode for c in conns.values() if c.authenticated}
        open_links = [links[a] for a in inode_of if a in links]

        def doom(found: list[Link], kind: str) -> None:
            for lk in found:
                self.tenants.doom(lk, kind)
                doomed.setdefault(inode_of[lk.addr], kind)

        doom([lk for lk in open_links if lk.doomed], "credential")
        if cfg.max_per_peer:
            gone: dict[str, int] = {}
            for i in doomed:
                gone[conns[i].ip] = gone.get(conns[i].ip, 0) + 1
            excess = {ip: n - gone.get(ip, 0) - cfg.max_per_peer for ip, n in per_ip.items()
                      if not (_loopback(ip) and not cfg.limit_loopback)}
            doom(over_peer(open_links, excess), "peer-idle")
        held = {cred: [lk for lk in mine if lk.addr in inode_of] for cred, mine in self.tenants.by_credential().items()}
        addrs = {(conns[i].ip, conns[i].port) for i in doomed}
        doom(over_cap(held, self.tenants.cap, addrs), "credential")
        left = len(conns) - len(doomed)
        if cfg.soft_budget and left > cfg.soft_budget:
            addrs = {(conns[i].ip, conns[i].port) for i in doomed}
            doom(over_fair(held, self._fair, left - cfg.soft_budget, addrs), "fair")

    def _close(self, verdict: _Verdict, closed: int) -> int:
        """Forget and log the connections `verdict` doomed, `closed` of which the closer shut down."""
        self.closed_total += closed
        by_kind: dict[str, dict[str, int]] = {}
        tenants: dict[str, dict[str, int]] = {}
        for inode, kind in verdict.doomed.items():
            c = self._conns.pop(inode, None)
            if c is not None and (lk := self.tenants.links.get((c.ip, c.port))) is not None and not lk.inflight:
                self.tenants.forget_link(lk)
            ip = verdict.ips[inode]
            by_kind.setdefault(kind, {})[ip] = by_kind.setdefault(kind, {}).get(ip, 0) + 1
            if cred := verdict.creds.get(inode):
                tenants.setdefault(kind, {})[cred] = tenants.setdefault(kind, {}).get(cred, 0) + 1
        for kind, ips in by_kind.items():
            whose = tenants.get(kind)
            self._note(f"conn:{kind}", "closed %d %s, from %s: %s", sum(ips.values()),
                       "connection(s) that sent no authenticated call" if whose is None else
                       "idle connection(s) of " + ", ".join(f"{describe(c)} ({n})" for c, n in
                                                            sorted(whose.items(), key=lambda kv: -kv[1])[:5]),
                       _ips(ips), self._why(kind, verdict.per_ip, verdict.total, ips))
        return closed

    def _why(self, kind: str, per_ip: dict[str, int], total: int, ips: dict[str, int]) -> str:
        cfg = self.config
        if kind == "auth":
            return f"none within {cfg.auth_timeout:g}s of connecting (--auth-timeout)"
        if kind in ("peer", "peer-idle"):
            worst = max(ips, key=lambda ip: per_ip.get(ip, 0))
            return (f"{worst} had {per_ip.get(worst, 0)} open connections (limit {cfg.max_per_peer}, "
                    "--max-connections-per-peer; those without an authenticated call go first, then idle ones)")
        if kind == "credential":
            return (f"the credential held more than {self.tenants.cap} connections (--max-connections-per-credential;"
                    " its longest-idle ones go first)")
        if kind == "fair":
            return (f"{total} connections were open, above {cfg.soft_budget} (90% of --max-connections): idle ones of "
                    f"tenants above their fair share (their job's agents and standbys + {FAIR_SLACK}) go next")
        return (f"{total} connections were open, above {cfg.soft_budget} (90% of --max-connections): those without "
                "an authenticated call go first")

    async def run(self) -> None:
        """Reading the kernel's table and /proc/self/fd happens in a worker thread: at 10,000 connections each
        is milliseconds of file reading that would otherwise stall every stream on the loop once a second."""
        self._wake = asyncio.Event()
        last = time.monotonic()
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.interval)
            self._wake.clear()
            # a flood of pokes: one scan per min_interval at most
            await asyncio.sleep(max(0.0, last + self.config.min_interval - time.monotonic()))
            last = time.monotonic()
            try:
                before = self.clock()
                verdict = self._decide(await asyncio.to_thread(self._table, self.config.port), before)
                if verdict.doomed:
                    self._close(verdict, await asyncio.to_thread(self._closer, set(verdict.doomed)))
            except Exception:  # a scan that fails must not end the server; the next one tries again
                log.exception("connection scan failed")
