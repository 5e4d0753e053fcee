"""`DLRecoverManager`: an agent's link to the recovery controller.

Drop-in for TaskD's class of the same name. The agent calls it from several threads (its rank
monitor, its recovery worker), so the unary calls use the synchronous gRPC API, each with a
deadline, and "nobody answers" becomes `ServerUnreachable` instead of a hang. The signal stream
runs on grpc.aio in the thread that calls `start_subscribe` (see there why).
The subscription survives controller restarts: it reconnects with jittered
backoff and re-initialises and re-registers the job before it subscribes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio

from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc
from taskd.toolkit.recover_module.backoff import Backoff
from taskd.toolkit.recover_module.channel import (
    DEFAULT_CHANNEL_OPTIONS,
    make_channel,
    normalize_address,
)
from taskd.toolkit.recover_module.errors import ConfigurationError, RecoverClientError, ServerUnreachable
from taskd.toolkit.recover_module.signals import (
    InvalidFaultRanks,
    RecoverSignal,
    fault_ranks_from_proto,
    fault_ranks_to_proto,
    parse_signal,
)
from taskd.vocabulary import Code, SignalType, Strategy, parse_strategies

__all__ = [
    "DEFAULT_CHANNEL_OPTIONS",
    "DEFAULT_ROLE",
    "ConfigurationError",
    "DLRecoverManager",
    "RecoverClientError",
    "RecoverSignal",
    "ServerUnreachable",
    "SignalHandler",
    "fault_ranks_from_proto",
    "fault_ranks_to_proto",
    "get_manager",
    "get_recover_manager_instance",
    "init_grpc_recover_manager",
    "manager_from_env",
    "parse_signal",
    "report_finished",
    "report_process_fault",
    "report_recover_status",
    "report_recover_strategy",
    "report_stop_complete",
    "set_manager",
]

logger = logging.getLogger(__name__)

DEFAULT_ROLE = "master agent"  # what TaskD's agent registers as
SignalHandler = Callable[[RecoverSignal], Any]

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Answers after which the same report is worth sending again, after a pause:
# the controller does not (or no longer) know this agent: re-register (and re-Init) first,
REREGISTER_CODES = frozenset({Code.NOT_REGISTERED, Code.JOB_NOT_EXIST, Code.NOT_INITIALISED})
# the controller is overloaded: just wait and re-send, registering again would only add load.
BUSY_CODES = frozenset({Code.RATE_LIMITED, Code.TOO_MANY_REQUESTS, Code.SIGNAL_QUEUE_BUSY})
_MIN_CALL_TIMEOUT = 0.05
_INT32 = (-(2**31), 2**31 - 1)


class _BadArgument(ValueError):
    """A report argument that cannot be sent; answered locally with 409."""


def _task_is_cancelling() -> bool:
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    return bool(cancelling()) if cancelling is not None else False


def _int32(value: object, what: str) -> int:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise _BadArgument(f"{what} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not _INT32[0] <= number <= _INT32[1]:
        raise _BadArgument(f"{what} must be a 32-bit integer, got {value!r}")
    return number


def _strategies(values: Iterable[object] | str | None) -> list[str]:
    """The offered strategies, validated: a typo must fail here, not be silently ignored by the controller."""
    if values is None:
        return []
    if not isinstance(values, str):
        values = list(values)
        for value in values:
            if not isinstance(value, str):
                raise ValueError(
                    f"strategy_list must hold strategy names, got {value!r}; known: {', '.join(Strategy.ORDER)}"
                )
    return parse_strategies(values)  # type: ignore[arg-type]


class DLRecoverManager:
    """Client of the `Recover` service for one agent of one job.

    `info` identifies the agent (jobId, role, and taskd's nodeRank/nodeCount/ranksPerNode);
    the manager keeps its own copy in `self.info` and sends it with Init, Register and the
    subscription, and its jobId and nodeRank with every report.
    """

    def __init__(
        self,
        info: recover_pb2.ClientInfo,
        server_addr: str,
        secure_conn: bool = False,
        cert_path: str = "",
        *,
        call_timeout: float = 10.0,
        init_attempts: int = 30,
        init_timeout: float = 120.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        liveness_timeout: float = 15.0,
        report_timeout: float = 30.0,
        wait_for_ready: bool = True,
        channel_options: Iterable[tuple[str, int | str]] = (),
    ) -> None:
        if not isinstance(info, recover_pb2.ClientInfo):
            raise TypeError(f"info must be a recover_pb2.ClientInfo, got {type(info).__name__}")
        if not info.jobId:
            raise ConfigurationError("ClientInfo.jobId is empty; every call needs the job id")
        if call_timeout <= 0 or init_timeout <= 0 or report_timeout <= 0 or init_attempts < 1:
            raise ConfigurationError(
                f"call_timeout, init_timeout and report_timeout must be > 0 and init_attempts >= 1 "
                f"(got {call_timeout}, {init_timeout}, {report_timeout}, {init_attempts})"
            )
        self.info = recover_pb2.ClientInfo()
        self.info.CopyFrom(info)
        if not self.info.host:
            self.info.host = socket.gethostname()
        if not self.info.pid:
            self.info.pid = os.getpid()
        self.client_info = self.info  # TaskD's attribute name
        self.server_addr = normalize_address(server_addr)
        self.call_timeout = float(call_timeout)
        self.init_attempts = int(init_attempts)
        self.init_timeout = float(init_timeout)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.liveness_timeout = float(liveness_timeout or 0)
        self.report_timeout = float(report_timeout)
        self.wait_for_ready = bool(wait_for_ready)
        self._channel_options = tuple(channel_options)
        self._credentials = self._load_credentials(cert_path) if secure_conn else None
        Backoff(self.backoff_initial, self.backoff_max)  # validate now, not in the first reconnect

        self._lock = threading.RLock()
        self._channel: grpc.Channel | None = None
        self._recover_stub: recover_pb2_grpc.RecoverStub | None = None
        self._report_stub: taskd_pb2_grpc.AgentReportStub | None = None
        self._handlers: dict[str, SignalHandler] = {}
        self._stopped = threading.Event()
        self._call: Any = None  # the open SubscribeProcessManageSignal call (grpc.aio, loop thread only)
        self._loop: asyncio.AbstractEventLoop | None = None  # start_subscribe's loop; set exactly while it runs
        self._wake: asyncio.Event | None = None  # set by stop() through the loop
        self._registered_with: recover_pb2.ClientInfo | None = None
        self._last_activity = 0.0  # monotonic; what the liveness watchdog compares against
        self._last_signal_mono: float | None = None  # last message on the current stream
        self.last_signal_time: float | None = None  # wall clock of the last signal received
        self.frame = "pytorch"  # set by start_subscribe; informational only (see there)

    # -- plumbing ---------------------------------------------------------------------------

    def _load_credentials(self, cert_path: str) -> grpc.ChannelCredentials:
        try:
            with open(cert_path, "rb") as fh:
                return grpc.ssl_channel_credentials(root_certificates=fh.read())
        except OSError as exc:
            raise ConfigurationError(
                f"secure_conn needs a readable CA certificate, cert_path={cert_path!r}: {exc}"
            ) from None

    def _stubs(self) -> tuple[recover_pb2_grpc.RecoverStub, taskd_pb2_grpc.AgentReportStub]:
        """The stubs, opening a channel if stop() closed the last one (reports still work)."""
        with self._lock:
            if self._channel is None:
                self._channel = make_channel(self.server_addr, self._channel_options, self._credentials)
                self._recover_stub = recover_pb2_grpc.RecoverStub(self._channel)
                self._report_stub = taskd_pb2_grpc.AgentReportStub(self._channel)
            assert self._recover_stub is not None and self._report_stub is not None
            return self._recover_stub, self._report_stub

    def _translate(self, exc: grpc.RpcError, method: str) -> RecoverClientError:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        name = code.name if code is not None else "UNKNOWN"
        if code in _UNREACHABLE:
            return ServerUnreachable(self.server_addr, f"{method}: {name}: {details}")
        return RecoverClientError(f"{method} to {self.server_addr} failed: {name}: {details}")

    def _unary(self, method: str, request: Any, *, timeout: float | None = None, agent_service: bool = False) -> Any:
        recover_stub, report_stub = self._stubs()
        rpc = getattr(report_stub if agent_service else recover_stub, method)
        try:
            return rpc(request, timeout=timeout or self.call_timeout, wait_for_ready=self.wait_for_ready)
        except grpc.RpcError as exc:
            raise self._translate(exc, method) from None
        except ValueError as exc:  # the channel was closed by stop() in another thread
            raise RecoverClientError(f"{method} to {self.server_addr} failed: {exc}") from None

    def _new_backoff(self) -> Backoff:
        return Backoff(self.backoff_initial, self.backoff_max)

    # -- job set-up ---------------------------------------------------------------------------

    def register(
        self, request: recover_pb2.ClientInfo | None = None, *, timeout: float | None = None
    ) -> recover_pb2.Status:
        """Register this agent (default: `self.info`); the request is reused on every re-register."""
        request = request if request is not None else self.info
        status = self._unary("Register", request, timeout=timeout)
        if status.code == Code.OK:
            self._registered_with = request
            logger.info("registered job %s node %d with %s", request.jobId, request.nodeRank, self.server_addr)
        else:
            logger.warning("Register of job %s answered %d: %s", request.jobId, status.code, status.info)
        return status

    def init_clusterd(self) -> bool:
        """Init the job on the controller: True once it answers 0, False for 403 (recovery disabled)
        or when it keeps refusing; raises ServerUnreachable when it never answered at all."""
        started = time.monotonic()
        deadline = started + self.init_timeout
        backoff = self._new_backoff()
        answered = False
        last_error: ServerUnreachable | None = None
        attempt = 0
        while attempt < self.init_attempts and not self._stopped.is_set():
            attempt += 1
            remaining = deadline - time.monotonic()
            try:
                status = self._unary("Init", self.info, timeout=max(0.05, min(self.call_timeout, remaining)))
            except ServerUnreachable as exc:
                last_error = exc
                logger.warning("Init attempt %d: %s", attempt, exc)
            else:
                answered = True
                if status.code == Code.OK:
                    logger.info("job %s initialised on %s", self.info.jobId, self.server_addr)
                    return True
                if status.code == Code.RECOVERY_DISABLED:
                    logger.warning("recovery is disabled for job %s: %s", self.info.jobId, status.info)
                    return False
                logger.warning("Init attempt %d answered %d: %s", attempt, status.code, status.info)
            delay = backoff.next_delay()
            if time.monotonic() + delay >= deadline or self._stopped.wait(delay):
                break
        if not answered and last_error is not None and not self._stopped.is_set():
            raise ServerUnreachable(
                self.server_addr,
                f"Init failed {attempt} times in {time.monotonic() - started:.1f}s; last: {last_error.detail}",
            )
        logger.error("job %s: Init did not succeed after %d attempts", self.info.jobId, attempt)
        return False

    def health_check(self) -> recover_pb2.Status:
        """0 when the controller knows this agent, 400 otherwise."""
        return self._unary("HealthCheck", self.info)

    # -- reports ----------------------------------------------------------------------------

    def _reregister(self, code: int, timeout: float) -> None:
        if code in (Code.JOB_NOT_EXIST, Code.NOT_INITIALISED):
            status = self._unary("Init", self.info, timeout=timeout)
            logger.info("re-init of job %s answered %d %s", self.info.jobId, status.code, status.info)
        self.register(self._registered_with or self.info, timeout=timeout)

    def _report(self, method: str, build: Callable[[], Any], *, agent_service: bool = False,
                timeout: float | None = None) -> int:
        """Send; re-send after a jittered backoff while the answer says "busy" or "not registered"
        (re-registering first for the latter), all within `timeout` (default `report_timeout`);
        return the final code.

        Any other non-zero answer (except 409) gets one re-register and one re-send, as before.
        The pause comes before every re-send: when a restarted controller answers every agent of
        every job at once, immediate re-sends would hit it in the same burst again.
        """
        try:
            request = build()
        except (_BadArgument, InvalidFaultRanks) as exc:
            logger.error("%s not sent, invalid arguments: %s", method, exc)
            return int(Code.INVALID_PARAMS)
        budget = self.report_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget

        def send() -> recover_pb2.Status:
            timeout = max(_MIN_CALL_TIMEOUT, min(self.call_timeout, deadline - time.monotonic()))
            return self._unary(method, request, timeout=timeout, agent_service=agent_service)

        backoff = self._new_backoff()
        status = send()
        attempts = 1
        other_retried = False
        while status.code != Code.OK:
            code = int(status.code)
            if code == Code.INVALID_PARAMS:  # the same request would be refused again
                logger.error("%s refused as invalid: %s", method, status.info)
                return code
            retryable = code in BUSY_CODES or code in REREGISTER_CODES
            if not retryable and other_retried:
                break
            delay = backoff.next_delay()
            if time.monotonic() + delay + _MIN_CALL_TIMEOUT >= deadline:
                logger.error(
                    "%s still answered %d (%s) after %d attempt(s); giving up within its %.1fs deadline",
                    method, code, status.info, attempts, budget,
                )
                return code
            logger.warning("%s answered %d (%s); re-sending in %.2fs", method, code, status.info, delay)
            time.sleep(delay)
            if code not in BUSY_CODES:
                other_retried = other_retried or not retryable
                remaining = max(_MIN_CALL_TIMEOUT, min(self.call_timeout, deadline - time.monotonic()))
                self._reregister(code, remaining)
            status = send()
            attempts += 1
        if status.code != Code.OK:
            logger.error("%s answered %d after re-register: %s", method, status.code, status.info)
            return int(status.code)
        if attempts > 1:
            logger.info("%s accepted after %d attempts", method, attempts)
        return 0

    def report_stop_complete(self, code: int, msg: str, fault_ranks: dict) -> int:
        """Tell the controller the faulty local ranks are stopped (code 0) or could not be."""
        return self._report(
            "ReportStopComplete",
            lambda: recover_pb2.StopCompleteRequest(
                jobId=self.info.jobId,
                status=recover_pb2.Status(code=_int32(code, "code"), info=str(msg or "")),
                faultRanks=fault_ranks_to_proto(fault_ranks),
                nodeRank=self.info.nodeRank,
            ),
        )

    def report_recover_strategy(self, fault_ranks: dict, strategy_list: list) -> int:
        """Offer the strategies this agent can carry out for the fault ranks of the round.

        `strategy_list` is a list of names or a comma-separated string. An unknown or non-string
        entry raises ValueError (naming it and the known strategies) before anything is sent: an
        agent offering a misspelt strategy is misconfigured, and a 409 would hide that in a log.
        """
        strategies = _strategies(strategy_list)
        return self._report(
            "ReportRecoverStrategy",
            lambda: recover_pb2.RecoverStrategyRequest(
                jobId=self.info.jobId,
                faultRanks=fault_ranks_to_proto(fault_ranks),
                strategies=strategies,
                nodeRank=self.info.nodeRank,
            ),
        )

    def report_recover_status(
        self, code: int, msg: str, fault_ranks: dict, strategy: str, isolate_ranks: Iterable[int] | None = None
    ) -> int:
        """Report how carrying out `strategy` went (0 = success).

        RecoverStatusRequest has no fault-rank field (nor has ClusterD's): `fault_ranks` is kept for
        TaskD's signature and only checked; `isolate_ranks` fills `isolateRankIds`.
        """

        def build() -> recover_pb2.RecoverStatusRequest:
            fault_ranks_to_proto(fault_ranks)
            return recover_pb2.RecoverStatusRequest(
                jobId=self.info.jobId,
                status=recover_pb2.Status(code=_int32(code, "code"), info=str(msg or "")),
                strategy=str(strategy or ""),
                isolateRankIds=[str(_int32(r, "isolate rank")) for r in (isolate_ranks or ())],
                nodeRank=self.info.nodeRank,
            )

        return self._report("ReportRecoverStatus", build)

    def report_process_fault(self, fault_ranks: dict, detail: str = "") -> int:
        """Report ranks that died or hung: `{global_rank: fault_type}`."""
        return self._report(
            "ReportProcessFault",
            lambda: recover_pb2.ProcessFaultRequest(
                jobId=self.info.jobId,
                faultRanks=fault_ranks_to_proto(fault_ranks),
                nodeRank=self.info.nodeRank,
                detail=str(detail or ""),
            ),
        )

    def report_finished(self, exit_code: int, message: str = "", timeout: float | None = None) -> int:
        """Tell the controller every local rank has ended (taskd's own AgentReport service).

        `timeout` bounds the whole call (default `report_timeout`): an agent leaving a controller
        it already lost should not wait long for it.
        """
        return self._report(
            "ReportFinished",
            lambda: taskd_pb2.FinishRequest(
                jobId=self.info.jobId,
                nodeRank=self.info.nodeRank,
                exitCode=_int32(exit_code, "exit_code"),
                message=str(message or ""),
            ),
            agent_service=True,
            timeout=timeout,
        )

    # -- signals ----------------------------------------------------------------------------

    def register_action_handler(self, name: str, fn: SignalHandler | None) -> None:
        """Handle an action (`stop_train`, ...) or a signal type (`killMaster`, ...); None removes."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"handler name must be a non-empty string, got {name!r}")
        if fn is not None and not callable(fn):
            raise TypeError(f"handler for {name!r} is not callable: {fn!r}")
        with self._lock:  # copy on write: _dispatch reads the current dict without copying it
            handlers = dict(self._handlers)
            if fn is None:
                handlers.pop(name, None)
            else:
                handlers[name] = fn
            self._handlers = handlers

    def _run_handler(self, name: str, fn: SignalHandler, signal: RecoverSignal) -> None:
        # Handlers run on the loop thread, so the liveness task cannot fire while one runs; the
        # activity stamp afterwards gives the stream a full timeout again (a long handler is no silence).
        try:
            fn(signal)
        except Exception:
            logger.exception("handler for %r failed on signal %s; the stream goes on", name, signal.uuid)
        finally:
            with self._lock:
                self._last_activity = time.monotonic()

    def _dispatch(self, message: recover_pb2.ProcessManageSignal) -> None:
        """Signal-type handler first, then one handler per action, in the signal's order."""
        now = time.monotonic()
        with self._lock:
            self._last_activity = now
            self._last_signal_mono = now
            self.last_signal_time = time.time()
        handlers = self._handlers  # replaced, never mutated, by register_action_handler
        if message.jobId and message.jobId != self.info.jobId:
            logger.warning(
                "dropping %s signal %s for job %r: this agent serves job %r",
                message.signalType,
                message.uuid,
                message.jobId,
                self.info.jobId,
            )
            return
        keep_alive = message.signalType == SignalType.KEEP_ALIVE
        if keep_alive and SignalType.KEEP_ALIVE not in handlers and not message.actions:
            return  # the common case every few seconds: only the stamps above matter
        signal = parse_signal(message)
        if not keep_alive:
            logger.info(
                "signal %s %s actions=%s fault_ranks=%s strategy=%r",
                signal.uuid,
                signal.signal_type,
                signal.actions,
                signal.fault_ranks,
                signal.strategy,
            )
        type_handler = handlers.get(signal.signal_type)
        if type_handler is not None:
            self._run_handler(signal.signal_type, type_handler, signal)
        elif not keep_alive and not signal.actions:
            logger.warning("no handler for signal type %r (signal %s) and no actions", signal.signal_type, signal.uuid)
        for action in dict.fromkeys(signal.actions):
            handler = handlers.get(action)
            if handler is None:
                logger.warning("no handler registered for action %r (signal %s); ignored", action, signal.uuid)
            else:
                self._run_handler(action, handler, signal)

    @property
    def connected(self) -> bool:
        """True while the signal stream is open and a signal arrived within the liveness timeout."""
        with self._lock:
            if self._call is None or self._last_signal_mono is None:
                return False
            return self.liveness_timeout <= 0 or time.monotonic() - self._last_signal_mono <= self.liveness_timeout

    def _resync(self) -> None:
        if not self.init_clusterd():
            raise RecoverClientError(f"Init of job {self.info.jobId} on {self.server_addr} did not succeed")
        status = self.register(self._registered_with or self.info)
        if status.code != Code.OK:
            raise RecoverClientError(f"Register on {self.server_addr} answered {status.code}: {status.info}")

    async def _listen(self, channel: grpc.aio.Channel, backoff: Backoff) -> None:
        """Dispatch the messages of one subscription until it ends, breaks or is cancelled."""
        call = recover_pb2_grpc.RecoverStub(channel).SubscribeProcessManageSignal(
            self.info, wait_for_ready=self.wait_for_ready
        )
        with self._lock:
            if self._stopped.is_set():
                call.cancel()
                return
            self._call = call
            self._last_activity = time.monotonic()
            self._last_signal_mono = None
        try:
            while True:
                try:
                    message = await call.read()
                except asyncio.CancelledError:
                    # grpc.aio reports a locally cancelled call (stop(), the liveness task) this way;
                    # only a cancellation of this task itself must propagate.
                    if _task_is_cancelling():
                        raise
                    return
                if message is grpc.aio.EOF:
                    return
                if self._last_signal_mono is None:
                    logger.info("subscribed to signals of job %s at %s", self.info.jobId, self.server_addr)
                    backoff.reset()
                self._dispatch(message)
                if self._stopped.is_set():
                    return
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
                call, last = self._call, self._last_activity
            now = time.monotonic()
            if call is None:
                await asyncio.sleep(idle_tick)
                continue
            due = last + self.liveness_timeout
            if now < due:
                await asyncio.sleep(due - now)
                continue
            with self._lock:
                self._last_activity = now
            logger.warning(
                "no signal from %s for %.1fs; reopening the signal stream", self.server_addr, self.liveness_timeout
            )
            call.cancel()

    async def _pause(self, delay: float) -> None:
        """Sleep `delay` seconds, or less if stop() wakes the loop."""
        assert self._wake is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _subscribe_forever(self) -> None:
        backoff = self._new_backoff()
        need_sync = self._registered_with is None
        channel = make_channel(self.server_addr, self._channel_options, self._credentials, aio=True)
        watchdog = asyncio.create_task(self._watch_liveness()) if self.liveness_timeout > 0 else None
        try:
            while not self._stopped.is_set():
                try:
                    if need_sync:
                        self._resync()  # blocking, on this thread: nothing else is due meanwhile
                    need_sync = True
                    await self._listen(channel, backoff)
                    if not self._stopped.is_set():
                        logger.warning("signal stream from %s ended; reconnecting", self.server_addr)
                except grpc.RpcError as exc:
                    if not self._stopped.is_set():
                        broken = self._translate(exc, "Subscribe")
                        logger.warning("signal stream from %s broke: %s", self.server_addr, broken)
                except RecoverClientError as exc:
                    if not self._stopped.is_set():
                        logger.warning("cannot resubscribe yet: %s", exc)
                except Exception:  # a bug must not silently end the agent's only link to the controller
                    if not self._stopped.is_set():
                        logger.exception("signal stream from %s failed unexpectedly; resubscribing", self.server_addr)
                if self._stopped.is_set():
                    break
                await self._pause(backoff.next_delay())
        finally:
            if watchdog is not None:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
            await channel.close()

    def _wake_subscriber(self) -> None:
        """Runs on the loop thread (scheduled by stop()): end the pause or the open call."""
        if self._wake is not None:
            self._wake.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def start_subscribe(self, frame: str = "pytorch") -> None:
        """Receive and dispatch signals until stop(); blocks, so run it in its own thread.

        The stream runs on an asyncio loop owned by this thread (grpc.aio), so an idle subscription
        sleeps until a message, a keepalive or the liveness deadline instead of polling (the synchronous
        stream iterator wakes every 100 ms and its channel spins a thread).

        `frame` (TaskD's signature: the training framework) changes nothing: the `Recover` service has
        no field for it and the controller's decisions do not depend on it. It is kept in `self.frame`
        and named in the subscription's log lines, so a mixed-framework cluster can be told apart there.
        """
        with self._lock:
            if self._loop is not None:
                raise RuntimeError("start_subscribe is already running for this manager")
            if self._stopped.is_set():
                logger.info("start_subscribe called after stop(); not subscribing")
                return
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._wake = asyncio.Event()
        self.frame = str(frame)
        logger.info("subscribing to signals of job %s at %s (frame %s)", self.info.jobId, self.server_addr, self.frame)
        try:
            loop.run_until_complete(self._subscribe_forever())
        finally:
            with self._lock:
                self._loop = None
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
            logger.info("signal subscription of job %s (frame %s) stopped", self.info.jobId, self.frame)

    def stop(self) -> None:
        """End start_subscribe promptly and close the channel; safe from any thread, idempotent."""
        self._stopped.set()
        with self._lock:
            loop, channel = self._loop, self._channel
            self._channel = self._recover_stub = self._report_stub = None
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                loop.call_soon_threadsafe(self._wake_subscriber)
        if channel is not None:
            channel.close()

    close = stop

    def __enter__(self) -> DLRecoverManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# -- the process's current manager and TaskD's module functions ------------------------------------

_current_lock = threading.Lock()
_current: DLRecoverManager | None = None


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} is not an integer") from None


def manager_from_env(environ: Mapping[str, str] | None = None, **kwargs: Any) -> DLRecoverManager:
    """Build a manager from MINDX_TASK_ID and MINDX_SERVER_IP (host or host:port).

    Optional: TASKD_NODE_RANK, TASKD_NODE_COUNT, TASKD_RANKS_PER_NODE fill taskd's ClientInfo fields.
    """
    env = os.environ if environ is None else environ
    job_id = env.get("MINDX_TASK_ID", "").strip()
    server = env.get("MINDX_SERVER_IP", "").strip()
    missing = [name for name, value in (("MINDX_TASK_ID", job_id), ("MINDX_SERVER_IP", server)) if not value]
    if missing:
        raise ConfigurationError(
            f"no recover manager was set and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "not set: call set_manager(), or export MINDX_TASK_ID (job id) and MINDX_SERVER_IP (host or host:port)"
        )
    info = recover_pb2.ClientInfo(
        jobId=job_id,
        role=DEFAULT_ROLE,
        nodeRank=_env_int(env, "TASKD_NODE_RANK", 0),
        nodeCount=_env_int(env, "TASKD_NODE_COUNT", 0),
        ranksPerNode=_env_int(env, "TASKD_RANKS_PER_NODE", 0),
    )
    return DLRecoverManager(info, server, **kwargs)


def set_manager(manager: DLRecoverManager | None) -> None:
    """Make `manager` the one the module functions use (None forgets it)."""
    global _current
    if manager is not None and not isinstance(manager, DLRecoverManager):
        raise TypeError(f"expected a DLRecoverManager, got {type(manager).__name__}")
    with _current_lock:
        _current = manager


def get_manager() -> DLRecoverManager:
    """The current manager, built from the environment the first time if none was set."""
    global _current
    with _current_lock:
        if _current is None:
            _current = manager_from_env()
        return _current


get_recover_manager_instance = get_manager  # TaskD's name
init_grpc_recover_manager = manager_from_env  # TaskD's name


def report_stop_complete(code: int, msg: str, fault_ranks: dict) -> int:
    """TaskD's function: see DLRecoverManager.report_stop_complete."""
    return get_manager().report_stop_complete(code, msg, fault_ranks)


def report_recover_strategy(fault_ranks: dict, strategy_list: list) -> int:
    """TaskD's function: see DLRecoverManager.report_recover_strategy."""
    return get_manager().report_recover_strategy(fault_ranks, strategy_list)


def report_recover_status(code: int, msg: str, fault_ranks: dict, strategy: str) -> int:
    """TaskD's function: see DLRecoverManager.report_recover_status."""
    return get_manager().report_recover_status(code, msg, fault_ranks, strategy)


def report_process_fault(fault_ranks: dict) -> int:
    """TaskD's function: see DLRecoverManager.report_process_fault."""
    return get_manager().report_process_fault(fault_ranks)


def report_finished(exit_code: int, message: str = "") -> int:
    """See DLRecoverManager.report_finished."""
    return get_manager().report_finished(exit_code, message)
