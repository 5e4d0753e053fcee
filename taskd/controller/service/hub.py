"""Fan-out of signals to the agents' streams: one small bounded buffer per subscriber.

No thread and no timer per stream: a broadcast serialises the signal once and appends the same
bytes to every subscriber's buffer (the stream's response serializer passes bytes through); the
keep-alive comes from one shared ticker (`run_keepalive`). A subscriber that stops reading until
its buffer overflows is closed; its agent reconnects and is re-sent what it still owes.

k faults reported together must not cost k stopTrains to each of N agents: `post()` holds a job's
signals until the end of the event-loop turn, where a stopTrain replaces the job's stopTrain still
held, and a stopTrain queued to a stream replaces one that stream has not sent yet. A newer
stopTrain carries every fault of the round, and acknowledging an older one is not counted anyway.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid as uuidlib
from collections import deque

from taskd.controller.machine.events import Signal
from taskd.proto import recover_pb2
from taskd.vocabulary import SignalType

log = logging.getLogger(__name__)


def extra_params(sig: Signal) -> str:
    """extraParams: why a job ends ({"reason"}); for a changeStrategy, the live-recovery generation the agents
    name (docs/worker.md: the signal's per-job number, so every node gets the same one and it never repeats
    while the job lives), the job's restarts used, this round's charge included, and the round; plus the signal's own
    extras (taskd.assignNode's node rank). All from the signal's typed fields."""
    params: dict[str, object] = {"reason": sig.reason} if sig.reason else {}
    if sig.signal_type == SignalType.CHANGE_STRATEGY:
        params["generation"] = sig.generation
        params["restarts"] = sig.restarts
        params["round"] = sig.round  # the agent names it when it says training resumed (ResumedRequest)
    params.update(sig.extra)
    return json.dumps(params) if params else ""


def to_message(job_id: str, sig: Signal) -> recover_pb2.ProcessManageSignal:
    return recover_pb2.ProcessManageSignal(
        uuid=sig.uuid, jobId=job_id, signalType=sig.signal_type, actions=list(sig.actions),
        faultRanks=[recover_pb2.FaultRank(rankId=str(r), faultType=t) for r, t in sig.faults],
        changeStrategy=sig.strategy, timeout=sig.timeout, nodeRankIds=[str(n) for n in sig.nodes],
        extraParams=extra_params(sig),
    )


def to_wire(job_id: str, sig: Signal) -> bytes:
    """The signal as the stream sends it (serialised once, shared by every subscriber)."""
    return to_message(job_id, sig).SerializeToString()


_KEEPALIVE_PREFIX = uuidlib.uuid4().hex[:16]  # this process's
_keepalive_ids = itertools.count(1)


def keepalive_wire(job_id: str) -> bytes:
    """A keep-alive whose uuid is unique (this process's random prefix and a counter) without a uuid4 per
    message: one per job per tick, 10,000 jobs made os.urandom 4 % of the event loop."""
    return recover_pb2.ProcessManageSignal(uuid=f"{_KEEPALIVE_PREFIX}{next(_keepalive_ids):016x}", jobId=job_id,
                                           signalType=SignalType.KEEP_ALIVE).SerializeToString()


class Subscriber:
    """One open SubscribeProcessManageSignal stream of one agent: serialised signals waiting to be sent.

    Lighter than an asyncio.Queue (10,000 of them live at once): the buffer is allocated on the first
    signal, and at most one future exists, while the stream's handler waits."""

    __slots__ = ("job_id", "node_rank", "standby", "maxsize", "closed_reason", "_buf", "_waiter", "_last_supersedable",
                 "heard")

    def __init__(self, job_id: str, node_rank: int, maxsize: int, standby: tuple[str, int] | None = None) -> None:
        self.job_id = job_id
        self.node_rank = node_rank
        self.standby = standby  # a standby agent's stream: its (host, pid); it gets no broadcast
        self.maxsize = maxsize
        self.closed_reason = ""
        self._buf: deque[bytes | None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_supersedable = False  # the newest item not sent yet is a stopTrain
        self.heard = False  # a signal was queued since the last keep-alive tick (so this tick can skip it)

    def offer(self, data: bytes, droppable: bool = False, supersedes: bool = False) -> bool:
        """Queue serialised signal bytes; a full buffer drops a droppable one, else closes the stream.
        `supersedes` (a stopTrain): replace the newest unsent item if that is a stopTrain too."""
        if self.closed_reason:
            return False
        buf = self._buf
        if buf is None:
            buf = self._buf = deque()
        elif supersedes and self._last_supersedable:
            buf[-1] = data
            return True
        elif len(buf) >= self.maxsize:
            if not droppable:
                log.warning("job %s node %d: signal queue full, closing its stream", self.job_id, self.node_rank)
                self.close("signal queue overflow")
            return False
        buf.append(data)
        self._last_supersedable = supersedes
        if not droppable:
            self.heard = True
        self._wake()
        return True

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def pending(self) -> int:
        return len(self._buf) if self._buf else 0

    def get_nowait(self) -> bytes | None:
        """The next item (None = the stream is closed); IndexError when there is none."""
        if not self._buf:
            raise IndexError("no signal waiting")
        item = self._buf.popleft()
        if not self._buf:
            self._buf = None  # an idle stream holds no buffer (a deque is ~600 bytes)
            self._last_supersedable = False
        return item

    async def get(self) -> bytes | None:
        """Wait for the next serialised signal; None means the stream was closed."""
        while not self._buf:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.get_nowait()

    def close(self, reason: str) -> None:
        """End the stream: the handler sees None and returns."""
        if self.closed_reason:
            return
        self.closed_reason = reason
        self._buf = deque((None,))
        self._last_supersedable = False
        self._wake()


class SignalHub:
    """Subscribers by job and node rank; an agent's new stream replaces its previous one."""

    def __init__(self, queue_size: int = 1024) -> None:
        self.queue_size = queue_size
        self._subs: dict[str, dict[int, Subscriber]] = {}
        self._standbys: dict[str, dict[tuple[str, int], Subscriber]] = {}  # standby streams: keep-alives and their own
        self.serialised = 0  # signals serialised by broadcasts and keep-alives (once each, not per stream)
        self._posted: dict[str, list[Signal]] = {}  # held until the end of the event-loop turn
        self._post_handle: asyncio.Handle | None = None

    def post(self, job_id: str, signals: list[Signal]) -> None:
        """Broadcast `signals` at the end of this event-loop turn, a stopTrain replacing a held one."""
        held = self._posted.setdefault(job_id, [])
        for sig in signals:
            if sig.signal_type == SignalType.STOP_TRAIN and held and held[-1].signal_type == SignalType.STOP_TRAIN:
                log.debug("job %s: stopTrain %s supersedes %s before it went out", job_id, sig.uuid, held[-1].uuid)
                held[-1] = sig
            else:
                held.append(sig)
        if self._post_handle is None:
            try:
                self._post_handle = asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop running: nothing to batch with
                self.flush()

    def flush(self, job_id: str | None = None) -> None:
        """Broadcast what `post` holds (for one job, or all); before a direct signal or a new stream."""
        if job_id is not None:
            held = self._posted.pop(job_id, None)
            if held:
                self._send(job_id, held)
            return
        if self._post_handle is not None:
            self._post_handle.cancel()
            self._post_handle = None
        posted, self._posted = self._posted, {}
        for job, held in posted.items():
            self._send(job, held)

    def _send(self, job_id: str, signals: list[Signal]) -> None:
        reached = self.broadcast(job_id, signals)
        for sig in signals:
            log.info("job %s: %s %s to %d agent(s)", job_id, sig.signal_type, sig.strategy, reached)

    def subscribe(self, job_id: str, node_rank: int) -> Subscriber:
        self.flush(job_id)  # the new stream is sent what it owes directly, not a held broadcast too
        sub = Subscriber(job_id, node_rank, self.queue_size)
        subs = self._subs.get(job_id)
        if subs is None:
            subs = self._subs[job_id] = {}
        old = subs.get(node_rank)
        if old is not None:
            old.close("replaced by a newer stream of the same agent")
        subs[node_rank] = sub
        return sub

    def subscribe_standby(self, job_id: str, key: tuple[str, int]) -> Subscriber:
        """A standby's stream (by host and pid): keep-alives and the signals addressed to it, no broadcast."""
        sub = Subscriber(job_id, -1, self.queue_size, standby=key)
        subs = self._standbys.setdefault(job_id, {})
        old = subs.get(key)
        if old is not None:
            old.close("replaced by a newer stream of the same standby")
        subs[key] = sub
        return sub

    def to_standby(self, job_id: str, key: tuple[str, int], data: bytes | None) -> bool:
        """Queue `data` on a standby's stream (None: close it); False when it has none open."""
        sub = self._standbys.get(job_id, {}).get(key)
        if sub is None:
            return False
        if data is None:
            sub.close("the standby became a node of the job")
        else:
            sub.offer(data)
        return True

    def has_standby(self, job_id: str, key: tuple[str, int]) -> bool:
        return key in self._standbys.get(job_id, {})

    def unsubscribe(self, sub: Subscriber) -> bool:
        """Forget `sub`; True if it was still the agent's current stream."""
        if sub.standby is not None:
            standbys = self._standbys.get(sub.job_id, {})
            if standbys.get(sub.standby) is not sub:
                return False
            del standbys[sub.standby]
            if not standbys:
                self._standbys.pop(sub.job_id, None)
            return True
        subs = self._subs.get(sub.job_id, {})
        if subs.get(sub.node_rank) is sub:
            del subs[sub.node_rank]
            if not subs:
                self._subs.pop(sub.job_id, None)
            return True
        return False

    def stream_count(self) -> int:
        """Streams open now, the standbys' included; callable from another thread (the metrics exporter's):
        copies under the GIL."""
        return sum(len(subs) for subs in [*self._subs.values(), *self._standbys.values()])

    def has(self, job_id: str, node_rank: int) -> bool:
        return node_rank in self._subs.get(job_id, {})

    def broadcast(self, job_id: str, signals: list[Signal]) -> int:
        """Queue `signals` for every agent of the job; returns the number of subscribers reached."""
        subs = list(self._subs.get(job_id, {}).values())
        for sig in signals:
            data = to_wire(job_id, sig)
            self.serialised += 1
            supersedes = sig.signal_type == SignalType.STOP_TRAIN
            for sub in subs:
                sub.offer(data, supersedes=supersedes)
        return len(subs)

    def count(self, job_id: str | None = None) -> int:
        """Streams open (a job's, or all), the standbys' included: a job a standby still streams from is not idle."""
        if job_id is not None:
            return len(self._subs.get(job_id, {})) + len(self._standbys.get(job_id, {}))
        return self.stream_count()

    def close_all(self, reason: str) -> None:
        self.flush()
        for subs in [*self._subs.values(), *self._standbys.values()]:
            for sub in list(subs.values()):
                sub.close(reason)

    def keepalive_once(self) -> int:
        """A keep-alive to every stream that needs one; returns how many were queued. A stream with something
        still unsent, or queued a signal since the last tick, is skipped: what it is sent is as live a sign
        (the client's liveness watchdog counts any message), so every stream still hears something at least
        every second tick, and 10,000 streams busy with a round are not sent 2,000 extra messages a second."""
        queued = 0
        for job_id in {*self._subs, *self._standbys}:
            data: bytes | None = None
            for sub in [*self._subs.get(job_id, {}).values(), *self._standbys.get(job_id, {}).values()]:
                if sub.heard or sub.pending():
                    sub.heard = False
                    continue
                if data is None:
                    data = keepalive_wire(job_id)
                    self.serialised += 1
                if sub.offer(data, droppable=True):
                    queued += 1
        return queued

    async def run_keepalive(self, interval: float) -> None:
        """The one ticker that feeds every stream's keep-alive."""
        while True:
            await asyncio.sleep(interval)
            self.keepalive_once()
