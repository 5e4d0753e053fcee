"""Connections per tenant: each credential (a job's, or the admin token) holds at most its share of them.

A job credential authenticates whether or not its job exists (an HMAC, auth.py), and a connection that
authenticated once used to be closed by nothing but `--idle-timeout` (600 s): 230 connections of one
credential, one call each, held 200 of `--max-connections 200`, and every other job's new connection was
refused (issue 31, F3). So every connection that carries an authenticated call is bound to that call's
credential here, and

- **cap**: one credential holds at most `--max-connections-per-credential` connections (default a quarter of
  `--max-connections`), idle or not. A call on a new connection of a credential at its cap takes the place of
  that credential's longest-idle connection, which is closed; when every one of them has a call in flight the
  call is refused (RESOURCE_EXHAUSTED, naming the flag);
- **fair share**: when the server holds more than 90 % of `--max-connections`, idle connections of credentials
  above their fair share (a job's registered agents and standbys plus `FAIR_SLACK`, the admin token
  `FAIR_SLACK`) are closed, the credential furthest above its share first, longest idle first;
- **per peer address**: idle authenticated connections count against `--max-connections-per-peer` too, after
  the unauthenticated ones (connections.py).

Only idle connections are ever closed here: an agent's connection carries its signal stream, always in flight.
A client whose idle connection was closed reconnects on its next call. Without a token (`--insecure`, or a
loopback server without one) there are no credentials and only the per-peer bounds apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from taskd.controller.service.auth import STATUS_READER

ADMIN = "admin"
"""The key of the admin token's connections; a job credential's is `job:<id>`."""
STATUS = "status"  # the status credential an embedded controller's locator holds (auth.status_credential)
JOB = "job:"
FAIR_SLACK = 4
"""Connections a tenant may keep idle beyond its job's nodes under pressure: `taskd status`, a retrying client."""


CLOSING = {
    "credential": "its credential is at --max-connections-per-credential and a newer connection took its place",
    "peer-idle": "its address is past --max-connections-per-peer",
    "fair": "the server is past 90% of --max-connections and its tenant above its fair share",
}
"""Why an idle authenticated connection is closed, by the limit that closed it."""


def credential_key(job: str | None) -> str:
    """"admin" for the admin token, "status" for the status credential, "job:<id>" for a job credential."""
    return ADMIN if job is None else STATUS if job == STATUS_READER else f"{JOB}{job}"


def describe(credential: str) -> str:
    """"job 'x''s credential" / "the admin token": how a log line or a refusal names a tenant."""
    if credential in (ADMIN, STATUS):
        return f"the {credential} {'token' if credential == ADMIN else 'credential'}"
    return f"job {credential[4:]!r}'s credential"


def fair_share(credential: str, job_size: Callable[[str], int | None]) -> int:
    """A tenant's fair share of connections under pressure: FAIR_SLACK plus, for a job credential whose job
    exists, its registered agents and standbys (`job_size(job id)`; None: no such job)."""
    size = job_size(credential[len(JOB):]) if credential.startswith(JOB) else None
    return FAIR_SLACK + (size or 0)


def default_cap(budget: int) -> int:
    """A quarter of `--max-connections`: three quarters stay for every other tenant whatever one does."""
    return max(1, budget // 4)


@dataclass
class Link:
    """One client connection, as the authenticated calls on it show it."""

    ip: str
    port: int
    credential: str | None
    last: float  # when a call on it last started or ended
    inflight: int = 0
    doomed: str = ""  # a key of CLOSING: closed at the next scan, and no call is taken on it meanwhile

    @property
    def addr(self) -> tuple[str, int]:
        return (self.ip, self.port)


def _addr(peer: str, normal: Callable[[str], str]) -> tuple[str, int] | None:
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return (normal(host.strip("[]")), int(port))
    except ValueError:
        return None


class Tenants:
    """`admit(peer, credential)` at each authenticated call (the guard, on the event loop); the connection
    watch reads `links` at each scan and `forget`s the connections the kernel no longer lists."""

    def __init__(self, cap: int, clock: Callable[[], float] = time.monotonic,
                 normal: Callable[[str], str] = lambda ip: ip, poke: Callable[[], None] | None = None) -> None:
        self.cap = cap  # 0 = no per-credential bound
        self.clock = clock
        self._normal = normal
        self._poke = poke or (lambda: None)
        self.links: dict[tuple[str, int], Link] = {}
        self._held: dict[str, set[tuple[str, int]]] = {}  # credential -> its links' addresses
        self._doomed: dict[str, int] = {}  # credential -> how many of its links are doomed (kept in step: no scan)
        self.refused = 0

    def held(self, credential: str) -> int:
        """Connections `credential` holds (those about to be closed not counted)."""
        return len(self._held.get(credential, ())) - self._doomed.get(credential, 0)

    def doom(self, link: Link, kind: str) -> None:
        """Mark `link` to be closed at the next scan; no call is taken on it meanwhile."""
        if not link.doomed and link.credential is not None:
            self._doomed[link.credential] = self._doomed.get(link.credential, 0) + 1
        link.doomed = link.doomed or kind

    def admit(self, peer: str, credential: str | None) -> tuple[str, Callable[[], None] | None]:
        """(refusal or "", release at the call's end). `credential` None: no token configured, nothing bound."""
        addr = _addr(peer, self._normal)
        if addr is None:
            return "", None
        now = self.clock()
        link = self.links.get(addr)
        if link is not None and link.credential != credential:  # a port reused by another client since
            self._drop(link)
            link = None
        if link is not None and link.doomed:
            self.refused += 1
            return f"this idle connection is being closed ({CLOSING[link.doomed]}): reconnect", None
        if link is None:
            if credential is not None and (why := self._make_room(credential)):
                self.refused += 1
                return why, None
            link = self.links[addr] = Link(addr[0], addr[1], credential, now)
            if credential is not None:
                self._held.setdefault(credential, set()).add(addr)
        link.inflight += 1
        link.last = now

        def release() -> None:
            link.inflight -= 1
            link.last = self.clock()

        return "", release

    def _make_room(self, credential: str) -> str:
        """"" when `credential` may open one more connection (its longest-idle one doomed if it is at its cap)."""
        if not self.cap or self.held(credential) < self.cap:  # counted, not scanned: a storm of one credential's
            return ""  # thousands of agents connecting costs O(1) each
        idle = [lk for a in self._held[credential] if not (lk := self.links[a]).doomed and lk.inflight == 0]
        if not idle:
            return (f"{describe(credential)} holds {self.held(credential)} connections, each with a call in flight "
                    f"(limit {self.cap}, --max-connections-per-credential): close one, or raise the limit")
        self.doom(min(idle, key=lambda lk: lk.last), "credential")
        self._poke()
        return ""

    def forget(self, still_open: set[tuple[str, int]], before: float) -> None:
        """Drop the links the kernel no longer lists, unless a call is in flight on one or it was seen since
        `before` (when the table was read: a connection may have opened since)."""
        for addr in [a for a, lk in self.links.items()
                     if a not in still_open and lk.inflight == 0 and lk.last < before]:
            self._drop(self.links[addr])

    def forget_link(self, link: Link) -> None:
        """The watch closed it."""
        self._drop(link)

    def _drop(self, link: Link) -> None:
        if self.links.get(link.addr) is not link:
            return
        del self.links[link.addr]
        if link.credential is not None and (held := self._held.get(link.credential)) is not None:
            held.discard(link.addr)
            if link.doomed:
                self._doomed[link.credential] -= 1
            if not held:
                del self._held[link.credential]
                self._doomed.pop(link.credential, None)

    def by_credential(self) -> dict[str, list[Link]]:
        out: dict[str, list[Link]] = {}
        for cred, addrs in self._held.items():
            out[cred] = [self.links[a] for a in addrs]
        return out


# ---------------------------------------------------------------------------------------- the policy, as data


def over_cap(held: dict[str, list[Link]], cap: int, doomed: set[tuple[str, int]]) -> list[Link]:
    """Idle links beyond each credential's cap, longest idle first (the ones already doomed count as gone)."""
    out: list[Link] = []
    if not cap:
        return out
    for links in held.values():
        live = [lk for lk in links if lk.addr not in doomed and not lk.doomed]
        excess = len(live) - cap
        if excess > 0:
            out.extend(sorted((lk for lk in live if lk.inflight == 0), key=lambda lk: lk.last)[:excess])
    return out


def over_fair(held: dict[str, list[Link]], fair: Callable[[str], int], excess: int,
              doomed: set[tuple[str, int]]) -> list[Link]:
    """Up to `excess` idle links of credentials above their fair share: one at a time from the credential
    furthest above its share, each time its longest-idle link."""
    idle: dict[str, list[Link]] = {}
    above: dict[str, int] = {}
    for cred, links in held.items():
        live = [lk for lk in links if lk.addr not in doomed and not lk.doomed]
        over = len(live) - fair(cred)
        if over > 0:
            above[cred] = over
            idle[cred] = sorted((lk for lk in live if lk.inflight == 0), key=lambda lk: lk.last, reverse=True)
    out: list[Link] = []
    while len(out) < excess:
        candidates = [c for c in above if above[c] > 0 and idle[c]]
        if not candidates:
            break
        cred = max(candidates, key=lambda c: above[c])
        out.append(idle[cred].pop())
        above[cred] -= 1
    return out


def over_peer(links: Iterable[Link], excess_by_ip: dict[str, int]) -> list[Link]:
    """Idle authenticated links of each IP still above its per-peer bound, longest idle first."""
    by_ip: dict[str, list[Link]] = {}
    for lk in links:
        if excess_by_ip.get(lk.ip, 0) > 0 and lk.inflight == 0 and not lk.doomed:
            by_ip.setdefault(lk.ip, []).append(lk)
    out: list[Link] = []
    for ip, mine in by_ip.items():
        out.extend(sorted(mine, key=lambda lk: lk.last)[:excess_by_ip[ip]])
    return out
