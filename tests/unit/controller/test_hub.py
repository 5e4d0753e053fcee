"""The signal hub: bounded per-subscriber buffers, replacement, keep-alives that never push signals out,
and each broadcast serialised once for every stream."""

from __future__ import annotations

import asyncio

from taskd.controller.machine.events import Signal
from taskd.controller.service.hub import SignalHub
from taskd.controller.service.servicers import RecoverService, recover_handler
from taskd.proto import recover_pb2

SIG = Signal(uuid="u1", signal_type="stopTrain", actions=("stop_train",), faults=((1, "1"),))
GF = Signal(uuid="g1", signal_type="globalFault", actions=("on_global_rank",), faults=((1, "1"),))


def parse(data: bytes | None) -> recover_pb2.ProcessManageSignal:
    assert data is not None
    return recover_pb2.ProcessManageSignal.FromString(data)


def test_broadcast_replace_and_overflow() -> None:
    async def scenario() -> None:
        hub = SignalHub(queue_size=3)
        a = hub.subscribe("j", 0)
        b = hub.subscribe("j", 1)
        other = hub.subscribe("k", 0)
        assert hub.broadcast("j", [SIG]) == 2
        msg = parse(a.get_nowait())
        assert msg.jobId == "j" and msg.signalType == "stopTrain" and msg.faultRanks[0].rankId == "1"
        assert other.pending() == 0

        newer = hub.subscribe("j", 1)  # the agent's new stream replaces the old one
        assert b.closed_reason and b.get_nowait() is None
        assert not hub.unsubscribe(b)  # the old stream's end does not drop the agent's new one
        assert hub.has("j", 1) and hub.count("j") == 2
        assert hub.broadcast("j", [SIG]) == 2 and parse(newer.get_nowait()).uuid == SIG.uuid

        for _ in range(5):  # keep-alives never pile up: one waits unsent, the next ticks skip the stream
            hub.keepalive_once()
        assert newer.pending() == 1 and not newer.closed_reason
        hub.broadcast("j", [GF, GF])
        assert newer.pending() == 3
        hub.broadcast("j", [SIG])  # a real signal that does not fit closes the stream
        assert newer.closed_reason == "signal queue overflow" and newer.get_nowait() is None
        assert hub.count() == 3
        hub.close_all("bye")
        assert a.closed_reason == "signal queue overflow" and other.closed_reason == "bye"

    asyncio.run(scenario())


def test_a_broadcast_is_serialised_once_and_every_stream_gets_the_same_bytes() -> None:
    async def scenario() -> None:
        hub = SignalHub()
        subs = [hub.subscribe("j", n) for n in range(500)]
        before = hub.serialised
        assert hub.broadcast("j", [SIG]) == 500
        assert hub.serialised == before + 1
        first = subs[0].get_nowait()
        assert all(s.get_nowait() is first for s in subs[1:])  # one bytes object, shared
        assert parse(first).uuid == "u1"

    asyncio.run(scenario())


def test_a_waiting_stream_wakes_on_a_signal_and_on_close() -> None:
    async def scenario() -> None:
        hub = SignalHub()
        sub = hub.subscribe("j", 0)
        waiting = asyncio.create_task(sub.get())
        await asyncio.sleep(0)
        hub.broadcast("j", [SIG])
        assert parse(await asyncio.wait_for(waiting, 10)).signalType == "stopTrain"
        waiting = asyncio.create_task(sub.get())
        await asyncio.sleep(0)
        sub.close("done")
        assert await asyncio.wait_for(waiting, 10) is None

    asyncio.run(scenario())


def test_recover_handler_serves_every_method_of_the_generated_service() -> None:
    methods = recover_pb2.DESCRIPTOR.services_by_name["Recover"].methods_by_name
    handler = recover_handler(RecoverService(None))  # type: ignore[arg-type]  # no call is made

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method

    for name, desc in methods.items():
        h = handler.service(Details(f"/Recover/{name}"))
        assert h is not None, name
        assert h.response_streaming == desc.server_streaming


def stop_train(uuid: str, *ranks: int) -> Signal:
    return Signal(uuid=uuid, signal_type="stopTrain", actions=("stop_train",), faults=tuple((r, "1") for r in ranks))


def test_stop_trains_posted_in_one_loop_turn_go_out_once() -> None:
    async def scenario() -> None:
        hub = SignalHub()
        subs = [hub.subscribe("j", n) for n in range(3)]
        before = hub.serialised
        hub.post("j", [stop_train("s1", 1)])
        hub.post("j", [stop_train("s2", 1, 2)])  # merged in the same turn: replaces s1
        gf = Signal(uuid="g1", signal_type="globalFault", actions=("on_global_rank",))
        hub.post("j", [gf, stop_train("s3", 1, 2, 3)])  # not across another signal
        assert all(s.pending() == 0 for s in subs)  # nothing before the end of the turn
        await asyncio.sleep(0)
        assert hub.serialised == before + 3
        got = [parse(subs[0].get_nowait()).uuid for _ in range(subs[0].pending())]
        assert got == ["s2", "g1", "s3"]

    asyncio.run(scenario())


def test_an_unsent_stop_train_is_replaced_by_a_newer_one_in_the_stream() -> None:
    async def scenario() -> None:
        hub = SignalHub()
        slow = hub.subscribe("j", 0)
        hub.broadcast("j", [stop_train("s1", 1)])
        hub.broadcast("j", [stop_train("s2", 1, 2)])  # s1 not sent yet: replaced
        assert slow.pending() == 1 and parse(slow.get_nowait()).uuid == "s2"
        hub.broadcast("j", [stop_train("s3", 1, 2, 3)])  # s2 went out: s3 follows it
        assert parse(slow.get_nowait()).uuid == "s3"
        hub.keepalive_once()  # skipped: the stream heard s3 since the last tick
        hub.keepalive_once()
        hub.broadcast("j", [stop_train("s4", 1, 2, 3, 4)])  # a keep-alive in between: appended
        assert [parse(slow.get_nowait()).signalType for _ in range(slow.pending())] == ["keep-alive", "stopTrain"]

    asyncio.run(scenario())


def test_a_new_stream_does_not_get_a_broadcast_held_before_it_subscribed() -> None:
    async def scenario() -> None:
        hub = SignalHub()
        old = hub.subscribe("j", 0)
        hub.post("j", [stop_train("s1", 1)])
        new = hub.subscribe("j", 1)  # flushes first: the controller re-sends what node 1 owes directly
        await asyncio.sleep(0)
        assert parse(old.get_nowait()).uuid == "s1" and new.pending() == 0

    asyncio.run(scenario())


def test_a_keep_alive_goes_only_to_streams_that_heard_nothing_since_the_last_tick() -> None:
    """A stream sent a signal since the last tick, or with something unsent, needs no keep-alive (any message
    is a live sign to the client's watchdog): every stream still hears something at least every second tick."""
    async def scenario() -> None:
        hub = SignalHub()
        busy, idle, backlog = hub.subscribe("j", 0), hub.subscribe("j", 1), hub.subscribe("k", 0)
        backlog.offer(b"unsent")
        hub.broadcast("j", [GF])
        busy.get_nowait()
        idle.get_nowait()
        idle.heard = False  # as if the signal came before the previous tick
        assert hub.keepalive_once() == 1
        assert idle.pending() == 1 and busy.pending() == 0 and backlog.pending() == 1
        assert parse(idle.get_nowait()).signalType == "keep-alive"
        assert hub.keepalive_once() == 2  # busy heard nothing since the last tick; backlog still has unsent bytes
        assert busy.pending() == 1 and idle.pending() == 1 and backlog.pending() == 1

    asyncio.run(scenario())


def test_standby_streams_count_among_the_streams_open() -> None:
    hub = SignalHub()
    node = hub.subscribe("j", 0)
    spare = hub.subscribe_standby("j", ("spare", 7))
    hub.subscribe_standby("k", ("spare", 8))  # a standby of a job none of whose nodes streams yet
    assert hub.stream_count() == 3 and hub.count() == 3
    assert hub.count("j") == 2 and hub.count("k") == 1  # a job a standby still streams from is not idle
    assert hub.unsubscribe(spare) and hub.unsubscribe(node)
    assert hub.stream_count() == 1 and hub.count("j") == 0
