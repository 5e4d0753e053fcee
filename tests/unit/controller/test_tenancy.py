"""The per-tenant connection policy (tenancy.py): a credential's cap, its fair share under pressure, and the
per-peer bound on idle authenticated connections, on a socket table handed to the watch (issue 31, F3)."""

from __future__ import annotations

from functools import partial

from support import ManualClock
from support.controller import connection_watch

from taskd.controller.service.tenancy import ADMIN, FAIR_SLACK, STATUS, Tenants, credential_key, default_cap, fair_share


def peer(port: int, ip: str = "10.0.0.1") -> str:
    return f"ipv4:{ip}:{port}"


def test_a_credential_at_its_cap_gives_up_its_longest_idle_connection_for_a_new_one() -> None:
    clock, pokes = ManualClock(100.0), []
    t = Tenants(3, clock, poke=lambda: pokes.append(1))
    for port in (1, 2, 3):
        clock.now += 1
        _, release = t.admit(peer(port), "job:a")
        assert release is not None
        release()
    assert t.held("job:a") == 3
    clock.now += 1
    why, release = t.admit(peer(4), "job:a")
    assert why == "" and release is not None
    assert t.links[("10.0.0.1", 1)].doomed == "credential" and pokes == [1]  # the oldest idle one goes
    assert t.held("job:a") == 3
    why, _ = t.admit(peer(1), "job:a")  # a call on the doomed connection: refused, it is being closed
    assert "being closed" in why and "--max-connections-per-credential" in why
    assert t.admit(peer(9), "job:b")[0] == ""  # another tenant is not touched


def test_the_counts_kept_in_step_agree_with_the_links_through_dooms_and_closings() -> None:
    clock = ManualClock(100.0)
    t = Tenants(5, clock)
    for port in range(40):  # 40 connections of one credential, one call each, against a cap of 5
        clock.now += 1
        _, release = t.admit(peer(port), "job:a")
        if release is not None:
            release()
        if port % 7 == 0:  # now and then the kernel no longer lists the doomed ones (the scan closed them)
            t.forget({a for a, lk in t.links.items() if not lk.doomed}, clock.now + 1)
        live = sum(1 for lk in t.links.values() if lk.credential == "job:a" and not lk.doomed)
        assert t.held("job:a") == live <= 5


def test_a_credential_whose_connections_all_have_calls_in_flight_is_refused_one_more() -> None:
    t = Tenants(2, ManualClock(100.0))
    held = [t.admit(peer(p), "job:a")[1] for p in (1, 2)]  # two long calls (signal streams)
    why, release = t.admit(peer(3), "job:a")
    assert release is None
    assert "job 'a''s credential holds 2 connections, each with a call in flight (limit 2" in why
    assert "--max-connections-per-credential" in why
    for r in held:
        assert r is not None
        r()
    assert t.admit(peer(3), "job:a")[0] == ""  # once one is idle, the new one takes its place


def test_without_credentials_or_cap_nothing_is_bounded() -> None:
    t = Tenants(1, ManualClock(100.0))
    assert all(t.admit(peer(p), None)[0] == "" for p in range(10))
    t = Tenants(0, ManualClock(100.0))
    assert all(t.admit(peer(p), "job:a")[0] == "" for p in range(10))
    assert credential_key(None) == ADMIN and credential_key("x") == "job:x"
    assert default_cap(200) == 50 and default_cap(2) == 1


def test_a_fair_share_is_a_jobs_agents_and_standbys_plus_slack_and_only_a_jobs() -> None:
    sizes = {"big": 12, "us": 1000}
    assert fair_share("job:big", sizes.get) == 12 + FAIR_SLACK
    assert fair_share("job:none", sizes.get) == FAIR_SLACK  # a credential whose job does not exist
    assert fair_share(ADMIN, sizes.get) == FAIR_SLACK
    assert fair_share(STATUS, sizes.get) == FAIR_SLACK  # not job "us"


# the tenancy tests set only the limits they test
watch = partial(connection_watch, auth_timeout=0, max_per_peer=0)


def test_the_watch_closes_a_credentials_idle_connections_beyond_its_cap_never_one_in_flight() -> None:
    table = {i: ("127.0.0.1", 7000 + i) for i in range(10)}
    w, clock, closed, notes = watch(table, cap=4)
    stream = None
    for i in range(10):
        clock.now += 1
        w.tenants.cap = 0  # opened before the cap applied (e.g. a raised limit lowered): the scan trims them
        _, release = w.tenants.admit(peer(7000 + i, "127.0.0.1"), "job:evil")
        if i == 0:
            stream = release  # the oldest has a call in flight: never closed
        elif release is not None:
            release()
    w.tenants.cap = 4
    assert w.scan() == 6
    assert closed == [{1, 2, 3, 4, 5, 6}]  # longest idle first, the one in flight kept
    assert "idle connection(s) of job 'evil''s credential (6)" in notes[0]
    assert "--max-connections-per-credential" in notes[0]
    assert stream is not None
    assert w.scan() == 0 and w.tenants.held("job:evil") == 4


def test_under_pressure_idle_connections_of_tenants_above_their_fair_share_go_first() -> None:
    table = {i: ("127.0.0.1", 7000 + i) for i in range(20)}
    w, clock, closed, notes = watch(table, fair=lambda cred: {"job:good": 10}.get(cred, 2), soft_budget=12, budget=20)
    for i in range(20):
        clock.now += 1
        cred = "job:good" if i % 2 else "job:evil"  # 10 each; good's all idle too, but within its share
        _, release = w.tenants.admit(peer(7000 + i, "127.0.0.1"), cred)
        assert release is not None
        release()
    assert w.scan() == 8
    assert all(i % 2 == 0 for i in closed[0])  # only evil's: it is 8 above its share of 2, good is at its own
    assert any("fair share" in n and "job 'evil''s credential (8)" in n for n in notes), notes


def test_idle_authenticated_connections_count_against_the_peer_bound_after_unauthenticated_ones() -> None:
    table = {i: ("10.0.0.9", 6000 + i) for i in range(8)}
    w, clock, closed, notes = watch(table, max_per_peer=3)
    for i in range(2, 8):
        clock.now += 1
        _, release = w.tenants.admit(peer(6000 + i, "10.0.0.9"), "job:a")
        if i != 7 and release is not None:
            release()
    assert w.scan() == 5
    # 8 open, limit 3: the two without a call first, then the three longest-idle authenticated ones
    assert closed == [{0, 1, 2, 3, 4}]
    assert any("without an authenticated call go first, then idle ones" in n for n in notes)


def test_connections_the_kernel_no_longer_lists_are_forgotten_unless_a_call_is_in_flight() -> None:
    table = {1: ("10.0.0.1", 1), 2: ("10.0.0.1", 2)}
    w, clock, _, _ = watch(table)
    _, release = w.tenants.admit(peer(1), "job:a")
    w.authenticated(peer(2), "job:a")
    table.clear()
    clock.now += 1
    w.scan()
    assert list(w.tenants.links) == [("10.0.0.1", 1)]  # in flight: kept until its call ends
    assert release is not None
    release()
    clock.now += 1
    w.scan()
    assert w.tenants.links == {} and w.tenants.held("job:a") == 0
