"""Fan-out of signals to the agents' streams: one bounded asyncio queue per subscriber.

No thread and no timer per stream: broadcasting is a `put_nowait` per subscriber and the
keep-alive comes from one shared ticker (`run_keepalive`). A subscriber that stops reading
until its queue overflows is closed; its agent reconnects and is re-sent what it still owes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid as uuidlib

from taskd.controller.state_machine import Signal
from taskd.proto import recover_pb2
from taskd.vocabulary import SignalType

log = logging.getLogger(__name__)


def to_message(job_id: str, sig: Signal) -> recover_pb2.ProcessManageSignal:
    return recover_pb2.ProcessManageSignal(
        uuid=sig.uuid, jobId=job_id, signalType=sig.signal_type, actions=list(sig.actions),
        faultRanks=[recover_pb2.FaultRank(rankId=str(r), faultType=t) for r, t in sig.faults],
        changeStrategy=sig.strategy, timeout=sig.timeout,
        extraParams=json.dumps({"reason": sig.reason}) if sig.reason else "",
    )


class Subscriber:
    """One open SubscribeProcessManageSignal stream of one agent."""

    def __init__(self, job_id: str, node_rank: int, maxsize: int) -> None:
        self.job_id = job_id
        self.node_rank = node_rank
        self.queue: asyncio.Queue[recover_pb2.ProcessManageSignal | None] = asyncio.Queue(maxsize)
        self.closed_reason = ""

    def offer(self, msg: recover_pb2.ProcessManageSignal, droppable: bool = False) -> bool:
        if self.closed_reason:
            return False
        try:
            self.queue.put_nowait(msg)
            return True
        except asyncio.QueueFull:
            if not droppable:
                log.warning("job %s node %d: signal queue full, closing its stream", self.job_id, self.node_rank)
                self.close("signal queue overflow")
            return False

    def close(self, reason: str) -> None:
        """End the stream: the handler sees None and returns."""
        if self.closed_reason:
            return
        self.closed_reason = reason
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class SignalHub:
    """Subscribers by job and node rank; an agent's new stream replaces its previous one."""

    def __init__(self, queue_size: int = 1024) -> None:
        self.queue_size = queue_size
        self._subs: dict[str, dict[int, Subscriber]] = {}

    def subscribe(self, job_id: str, node_rank: int) -> Subscriber:
        sub = Subscriber(job_id, node_rank, self.queue_size)
        old = self._subs.setdefault(job_id, {}).get(node_rank)
        if old is not None:
            old.close("replaced by a newer stream of the same agent")
        self._subs[job_id][node_rank] = sub
        return sub

    def unsubscribe(self, sub: Subscriber) -> bool:
        """Forget `sub`; True if it was still the agent's current stream."""
        subs = self._subs.get(sub.job_id, {})
        if subs.get(sub.node_rank) is sub:
            del subs[sub.node_rank]
            if not subs:
                self._subs.pop(sub.job_id, None)
            return True
        return False

    def has(self, job_id: str, node_rank: int) -> bool:
        return node_rank in self._subs.get(job_id, {})

    def is_current(self, sub: Subscriber) -> bool:
        return self._subs.get(sub.job_id, {}).get(sub.node_rank) is sub

    def broadcast(self, job_id: str, signals: list[Signal]) -> int:
        """Queue `signals` for every agent of the job; returns the number of subscribers reached."""
        subs = list(self._subs.get(job_id, {}).values())
        for sig in signals:
            msg = to_message(job_id, sig)
            for sub in subs:
                sub.offer(msg)
        return len(subs)

    def count(self, job_id: str | None = None) -> int:
        if job_id is not None:
            return len(self._subs.get(job_id, {}))
        return sum(len(s) for s in self._subs.values())

    def close_all(self, reason: str) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs.values()):
                sub.close(reason)

    def keepalive_once(self) -> None:
        for job_id, subs in list(self._subs.items()):
            msg = recover_pb2.ProcessManageSignal(uuid=uuidlib.uuid4().hex, jobId=job_id,
                                                  signalType=SignalType.KEEP_ALIVE)
            for sub in list(subs.values()):
                sub.offer(msg, droppable=True)

    async def run_keepalive(self, interval: float) -> None:
        """The one ticker that feeds every stream's keep-alive."""
        while True:
            await asyncio.sleep(interval)
            self.keepalive_once()
