"""Node 0's MASTER_PORT, held from the moment it is chosen or checked (issue 21, D6 and D8).

A port picked by binding port 0 and closing the socket is free only for that moment: any process's
next outgoing connection may take it as its ephemeral port before rank 0 binds it seconds later, and
every restart reused it. So the launcher keeps a socket bound to it, with SO_REUSEADDR and never
listening, for the job's life: the kernel hands the port to nobody else (no bind without
SO_REUSEADDR, no ephemeral use), while rank 0's TCPStore, which sets SO_REUSEADDR as every server
library does (libuv, asyncio, gRPC), still binds and listens on it. A port the user gave is checked
the same way up front, for every script: one that something listens on is refused before any rank
starts, with what to do, instead of every rank 0 failing until the restart budget is gone.
"""

from __future__ import annotations

import errno
import socket

from taskd.launcher.spec import WorkerSpec, free_port
from taskd.rendezvous.store import port_in_use


class MasterPortBusy(ValueError):
    """The master port is taken: the message says by what and what to do."""


def hold_master_port(port: int = 0) -> socket.socket:
    """A bound, non-listening socket on `port` (0: a free one) on every interface; the caller closes it."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("", port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise MasterPortBusy(port_in_use(port)) from None
        raise MasterPortBusy(f"rendezvous store: cannot bind port {port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    return sock


def node_master_port(spec: WorkerSpec) -> tuple[int, socket.socket | None]:
    """The port this node's ranks get as MASTER_PORT, and the socket that holds it on node 0 (the node whose
    rank 0 serves it: one the user gave that something listens on is refused here, before any rank starts)."""
    if spec.node_rank != 0:
        return spec.master_port or free_port(spec.master_addr), None
    hold = hold_master_port(spec.master_port)
    return hold.getsockname()[1], hold
