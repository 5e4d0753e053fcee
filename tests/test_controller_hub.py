"""The signal hub: bounded per-subscriber buffers, replacement, keep-alives that never push signals out,
and each broadcast serialised once for every stream."""

from __future__ import annotations

import asyncio

from taskd.controller.hub import SignalHub
from taskd.controller.service import RecoverService, recover_handler
from taskd.controller.state_machine import Signal
from taskd.proto import recover_pb2

SIG = Signal(uuid="u1", signal_type="stopTrain", actions=("stop_train",), faults=((1, "1"),))


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
        assert not hub.unsubscribe(b) and hub.is_current(newer)

        for _ in range(5):  # keep-alives fill the buffer but never overflow it
            hub.keepalive_once()
        assert newer.pending() == 3 and not newer.closed_reason
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
