"""The signal hub: bounded per-subscriber queues, replacement, keep-alives that never push signals out."""

from __future__ import annotations

import asyncio

from taskd.controller.hub import SignalHub
from taskd.controller.state_machine import Signal

SIG = Signal(uuid="u1", signal_type="stopTrain", actions=("stop_train",), faults=((1, "1"),))


def test_broadcast_replace_and_overflow() -> None:
    async def scenario() -> None:
        hub = SignalHub(queue_size=3)
        a = hub.subscribe("j", 0)
        b = hub.subscribe("j", 1)
        other = hub.subscribe("k", 0)
        assert hub.broadcast("j", [SIG]) == 2
        msg = a.queue.get_nowait()
        assert msg.jobId == "j" and msg.signalType == "stopTrain" and msg.faultRanks[0].rankId == "1"
        assert other.queue.empty()

        newer = hub.subscribe("j", 1)  # the agent's new stream replaces the old one
        assert b.closed_reason and b.queue.get_nowait() is None
        assert not hub.unsubscribe(b) and hub.is_current(newer)

        for _ in range(5):  # keep-alives fill the queue but never overflow it
            hub.keepalive_once()
        assert newer.queue.qsize() == 3 and not newer.closed_reason
        hub.broadcast("j", [SIG])  # a real signal that does not fit closes the stream
        assert newer.closed_reason == "signal queue overflow" and newer.queue.get_nowait() is None
        assert hub.count() == 3
        hub.close_all("bye")
        assert a.closed_reason == "signal queue overflow" and other.closed_reason == "bye"

    asyncio.run(scenario())
