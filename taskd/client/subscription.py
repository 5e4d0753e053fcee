"""The signal stream: subscribe, dispatch, notice silence, reconnect (re-Init and re-Register first).

It runs on grpc.aio, on a private asyncio loop owned by the thread that calls `run()`, so an idle
subscription sleeps until a message, a keep-alive or the liveness deadline instead of polling (the
synchronous stream iterator woke every 100 ms and its channel spun a thread). Nothing blocking runs
on that loop: the resync (blocking Init/Register calls with deadlines) and the handlers (which may
block, e.g. stop ranks or report) run in a worker thread, one at a time, in signal order, while the
loop keeps serving keepalives and stop(). The worker is a daemon thread, as the subscriber thread
usually is: a handler in flight must not hold up the interpreter's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from taskd.client.dispatch import Dispatcher
from taskd.client.errors import FencedError, HandedOver, RecoverClientError, ServerUnreachable
from taskd.client.retry import Backoff
from taskd.client.rpc import RpcClient, translate
from taskd.proto import recover_pb2, recover_pb2_grpc
from taskd.vocabulary import SignalType

logger = logging.getLogger(__name__)

# A stream the controller ended after it had carried signals is resubscribed at once, at most once this often
# (seconds); other ends and breaks back off, so a controller that keeps ending streams is not hammered.
QUICK_RESUBSCRIBE_EVERY = 5.0


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run blocking `fn` in a fresh daemon thread and await its result on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, fn())
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="taskd-client-worker", daemon=True).start()
    return await future


def _reason(message: recover_pb2.ProcessManageSignal) -> str:
    try:
        params = json.loads(message.extraParams or "{}")
    except ValueError:
        return message.extraParams
    return str(params.get("reason", "")) if isinstance(params, dict) else ""


def _task_is_cancelling() -> bool:
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    return bool(cancelling()) if cancelling is not None else False


class Subscription:
    """One client's signal stream. `run()` blocks until `stop()` (from any thread, a handler included)."""

    def __init__(self, rpc: RpcClient, dispatcher: Dispatcher, info: Callable[[], recover_pb2.ClientInfo],
                 resync: Callable[[], None], new_backoff: Callable[[], Backoff], stopped: threading.Event, *,
                 liveness_timeout: float, wait_for_ready: bool, handing_over: Callable[[], bool] = lambda: False
                 ) -> None:
        self._rpc = rpc
        self._dispatcher = dispatcher
        self._info = info
        self._resync = resync  # blocking; run in the worker thread
        self._new_backoff = new_backoff
        self._handing_over = handing_over  # its node passes to another agent: a stream's end is expected, not a fault
        self._stopped = stopped
        self.liveness_timeout = liveness_timeout
        self.wait_for_ready = wait_for_ready
        self._lock = threading.Lock()
        self._call: Any = None  # the open SubscribeProcessManageSignal call (loop thread only)
        self._loop: asyncio.AbstractEventLoop | None = None  # set exactly while run() runs
        self._wake: asyncio.Event | None = None  # set by stop() through the loop
        self._in_handler = False  # a handler runs: its time is no silence of the stream
        self._last_activity = 0.0  # monotonic; what the liveness watchdog compares against
        self._last_signal_mono: float | None = None  # last message on the current stream
        self.last_signal_time: float | None = None  # wall clock of the last signal received
        # why the controller fenced this agent (a `taskd.fenced` signal, or a 411 to the re-Init/Register):
        # the subscription ends and never resubscribes
        self.fenced_reason = ""

    @property
    def running(self) -> bool:
        with self._lock:
            return self._loop is not None

    @property
    def connected(self) -> bool:
        """True while the stream is open and a signal arrived within the liveness timeout."""
        with self._lock:
            if self._call is None or self._last_signal_mono is None:
                return False
            return self.liveness_timeout <= 0 or time.monotonic() - self._last_signal_mono <= self.liveness_timeout

    def run(self, need_sync: bool) -> None:
        """Subscribe and dispatch until stop(); `need_sync`: Init and Register before the first stream."""
        with self._lock:
            if self._loop is not None:
                raise RuntimeError("start_subscribe is already running for this manager")
            if self._stopped.is_set():
                logger.info("start_subscribe called after stop(); not subscribing")
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._wake = asyncio.Event()
        try:
            loop.run_until_complete(self._subscribe_forever(need_sync))
        finally:
            with self._lock:
                self._loop = None
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def stop(self) -> None:
        """Wake the loop (the caller has set the stopped event); returns at once."""
        with self._lock:
            loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                loop.call_soon_threadsafe(self._wake_subscriber)

    def _wake_subscriber(self) -> None:
        """Runs on the loop thread: end the pause or the open call."""
        if self._wake is not None:
            self._wake.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def _touch(self, *, signal: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            self._last_activity = now
            if signal:
                self._last_signal_mono = now
                self.last_signal_time = time.time()

    async def _handle(self, message: recover_pb2.ProcessManageSignal) -> None:
        work = self._dispatcher.prepare(message)
        if work is None:
            return
        with self._lock:
            self._in_handler = True
        try:
            await in_thread(work)
        finally:
            with self._lock:
                self._in_handler = False
            self._touch()  # the stream gets a full timeout again after a long handler

    async def _listen(self, channel: grpc.aio.Channel, backoff: Backoff) -> bool:
        """Dispatch the messages of one subscription until it ends, breaks or is cancelled; True when the
        controller ended a stream that had carried signals (it replaced it: a re-Register, a standby assigned)."""
        call = recover_pb2_grpc.RecoverStub(channel).SubscribeProcessManageSignal(
            self._info(), metadata=self._rpc.metadata, wait_for_ready=self.wait_for_ready
        )
        with self._lock:
            if self._stopped.is_set():
                call.cancel()
                return False
            self._call = call
            self._last_activity = time.monotonic()
            self._last_signal_mono = None
        info = self._info()
        try:
            while True:
                try:
                    message = await call.read()
                except asyncio.CancelledError:
                    # grpc.aio reports a locally cancelled call (stop(), the liveness task) this way;
                    # only a cancellation of this task itself must propagate.
                    if _task_is_cancelling():
                        raise
                    return False
                if message is grpc.aio.EOF:
                    return self._last_signal_mono is not None
                if self._last_signal_mono is None:
                    self._rpc.answered = True
                    logger.info("subscribed to signals of job %s at %s", info.jobId, self._rpc.target)
                    backoff.reset()
                self._touch(signal=True)
                await self._handle(message)
                if message.signalType == SignalType.FENCED:
                    self.fenced_reason = _reason(message) or "fenced by the controller"
                    return False
                if self._stopped.is_set():
                    return False
        finally:
            with self._lock:
                if self._call is call:
                    self._call = None
            call.cancel()

    async def _watch_liveness(self) -> None:
        """Cancel a stream that went silent; keep-alives keep it open.

        Sleeps until the stream's deadline rather than ticking, so an idle healthy stream costs one
        wake-up per keep-alive period at most.
        """
        idle_tick = min(1.0, self.liveness_timeout / 4)
        while True:
            with self._lock:
                call, last, busy = self._call, self._last_activity, self._in_handler
            now = time.monotonic()
            if call is None or busy:
                await asyncio.sleep(idle_tick)
                continue
            due = last + self.liveness_timeout
            if now < due:
                await asyncio.sleep(due - now)
                continue
            self._touch()
            logger.warning("no signal from %s for %.1fs; reopening the signal stream",
                           self._rpc.target, self.liveness_timeout)
            call.cancel()

    async def _pause(self, delay: float) -> None:
        """Sleep `delay` seconds, or less if stop() wakes the loop."""
        assert self._wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _subscribe_forever(self, need_sync: bool) -> None:
        backoff = self._new_backoff()
        quick_at = -QUICK_RESUBSCRIBE_EVERY  # the last resubscription made without a pause
        target = self._rpc.target
        channel = self._rpc.aio_channel()
        watchdog = asyncio.create_task(self._watch_liveness()) if self.liveness_timeout > 0 else None
        try:
            while not self._stopped.is_set():
                ended = False
                try:
                    if need_sync:
                        await in_thread(self._resync)
                    need_sync = True
                    ended = await self._listen(channel, backoff)
                    if self.fenced_reason:
                        logger.error("the controller fenced this agent; not resubscribing: %s", self.fenced_reason)
                        break
                    if not self._stopped.is_set() and not ended:
                        logger.warning("signal stream from %s ended; reconnecting", target)
                except FencedError as exc:  # the re-Init or re-Register was answered 411
                    self.fenced_reason = exc.info or str(exc)
                    logger.error("the controller fenced this agent; not resubscribing: %s", self.fenced_reason)
                    await self._handle(recover_pb2.ProcessManageSignal(
                        uuid="fenced", jobId=self._info().jobId, signalType=SignalType.FENCED,
                        extraParams=json.dumps({"reason": self.fenced_reason})))
                    break
                except grpc.RpcError as exc:
                    if not self._stopped.is_set():
                        why = translate(exc, "Subscribe", target, self._rpc.answered)
                        if isinstance(why, ServerUnreachable) and why.known:  # the controller went away
                            logger.warning("signal stream broke: %s; retrying", why)
                        else:
                            logger.warning("signal stream from %s broke: %s", target, why)
                except HandedOver as exc:  # this node is another agent's now, as a node migration meant
                    logger.info("signal stream of job %s handed over to the node's successor; not resubscribing (%s)",
                                self._info().jobId, exc)
                    break
                except RecoverClientError as exc:
                    if not self._stopped.is_set():
                        logger.warning("cannot resubscribe yet: %s; retrying", exc)
                except Exception:  # a bug must not silently end the agent's only link to the controller
                    if not self._stopped.is_set():
                        logger.exception("signal stream from %s failed unexpectedly; resubscribing", target)
                if self._stopped.is_set():
                    break
                now = time.monotonic()
                if ended and (now - quick_at >= QUICK_RESUBSCRIBE_EVERY or self._handing_over()):  # the re-Register
                    # says whether the node was handed over (HandedOver: the stream ends for good)
                    quick_at = now  # at once: a standby given a node waited 0.4 s here for nothing
                    logger.info("signal stream from %s ended by the controller; resubscribing at once", target)
                    continue
                if ended:
                    logger.warning("signal stream from %s ended again; reconnecting", target)
                await self._pause(backoff.next_delay())
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            await channel.close()
