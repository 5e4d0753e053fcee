"""ConnectionWatch's policy on a socket table it is handed: which connections it closes, and why."""

from __future__ import annotations

from support.controller import connection_watch

from taskd.controller.service.connections import _hex_ip, normal_ip


def test_a_connection_without_an_authenticated_call_is_closed_after_the_auth_timeout() -> None:
    table = {1: ("10.0.0.1", 5000), 2: ("10.0.0.2", 5001)}
    w, clock, closed, notes = connection_watch(table, auth_timeout=5.0, max_per_peer=0)
    assert w.scan() == 0
    w.authenticated("ipv4:10.0.0.2:5001")
    clock.now += 4.9
    assert w.scan() == 0
    clock.now += 0.2
    assert w.scan() == 1
    assert closed == [{1}]  # the one that proved the token stays, however old
    assert "10.0.0.1" in notes[0] and "--auth-timeout" in notes[0]
    clock.now += 100
    assert w.scan() == 0


def test_idle_connections_count_against_the_peer_budget_and_unauthenticated_ones_go_first() -> None:
    table = {i: ("10.0.0.9", 6000 + i) for i in range(1, 7)}
    table[50] = ("10.0.0.7", 7000)
    w, clock, closed, notes = connection_watch(table, auth_timeout=0, max_per_peer=3)
    for i in (5, 6):
        w.authenticated(f"ipv4:10.0.0.9:{6000 + i}")
    assert w.scan() == 3
    assert closed == [{1, 2, 3}]  # 6 open, limit 3: three without a call closed, oldest first; 5 and 6 kept
    assert "10.0.0.9 had 6 open connections (limit 3" in notes[0] and "--max-connections-per-peer" in notes[0]
    assert w.open_connections("10.0.0.9") == 3 and w.open_connections("10.0.0.7") == 1


def test_loopback_is_exempt_from_the_peer_budget_unless_asked() -> None:
    table = {i: ("127.0.0.2", 6000 + i) for i in range(5)}
    w, _, closed, _ = connection_watch(dict(table), auth_timeout=0, max_per_peer=2)
    assert w.scan() == 0
    w, _, closed, _ = connection_watch(dict(table), auth_timeout=0, max_per_peer=2, limit_loopback=True)
    assert w.scan() == 3


def test_past_the_soft_budget_unauthenticated_connections_are_closed_and_the_budget_logged() -> None:
    table = {i: (f"10.1.0.{i}", 6000) for i in range(1, 11)}
    w, _, closed, notes = connection_watch(table, auth_timeout=0, max_per_peer=0, soft_budget=6, budget=10)
    w.authenticated("ipv4:10.1.0.1:6000")
    assert w.scan() == 4
    assert 1 not in closed[0] and len(closed[0]) == 4
    assert any("at the budget of 10 (--max-connections)" in n for n in notes)


def test_addresses_from_the_kernel_table_and_from_grpc_agree() -> None:
    assert _hex_ip("0100007F") == "127.0.0.1"
    assert _hex_ip("0000000000000000FFFF00000100007F") == "127.0.0.1"  # ::ffff:127.0.0.1
    assert _hex_ip("00000000000000000000000001000000") == "::1"
    assert normal_ip("::ffff:10.0.0.1") == "10.0.0.1"
    w, _, _, _ = connection_watch({1: ("::1", 5)}, auth_timeout=1.0)
    w.authenticated("ipv6:[::1]:5")
    w.scan()
    assert w._conns[1].authenticated


def test_hundreds_of_closings_make_one_bounded_line_per_limit() -> None:
    table = {i: (f"10.2.{i % 40}.1", 6000 + i) for i in range(400)}
    w, _, closed, notes = connection_watch(table, auth_timeout=0, max_per_peer=2)
    assert w.scan() == 400 - 40 * 2
    assert len(notes) == 1 and "closed 320 connection(s)" in notes[0] and "and 35 more addresses" in notes[0]
