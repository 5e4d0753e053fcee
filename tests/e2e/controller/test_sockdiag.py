"""The connection watch's netlink reader agrees with the kernel's /proc tables, on real sockets."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from taskd.controller.service import connections, sockdiag


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    ls = socket.socket(socket.AF_INET6)
    ls.bind(("::", 0))
    ls.listen(16)
    port = ls.getsockname()[1]
    held = []
    try:
        for host in ("127.0.0.1", "127.0.0.1", "::1"):
            held.append(socket.create_connection((host, port), timeout=5))
            held.append(ls.accept()[0])
        yield ls, held
    finally:
        for s in held:
            s.close()
        ls.close()


def test_netlink_and_proc_list_the_same_connections_to_the_port(listener) -> None:  # noqa: ANN001
    ls, held = listener
    port = ls.getsockname()[1]
    found = sockdiag.established(port)
    if found is None:
        pytest.skip("no NETLINK_SOCK_DIAG here: the watch reads /proc instead")
    from_proc = connections.established(port, tables=connections.TABLES)
    assert found == from_proc
    assert len(found) == 3  # the server's three ends, none of the clients' (their local port is another)
    clients = {s.getsockname()[1] for s in held[0::2]}
    assert {p for _, p in found.values()} == clients
    assert sorted(ip for ip, _ in found.values()) == ["127.0.0.1", "127.0.0.1", "::1"]  # ::ffff:127.0.0.1 as IPv4
    assert connections.established(port) == found  # the watch's default asks netlink


def test_a_port_nobody_is_connected_to_has_no_connections() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing can be established on it
        found = sockdiag.established(port)
    assert found in ({}, None)
