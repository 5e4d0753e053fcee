"""`DLRecoverManager`: an agent's link to the recovery controller, as a facade over the client's parts.

Drop-in for TaskD's class of the same name. The parts: `RpcClient` (channel, deadlines, credentials),
`ReportRetryPolicy` (when the blocking `report_*` methods, for TaskD-API callers only, re-send a
report), `Subscription` (the signal stream and its reconnects), `Dispatcher` (action -> handler) and
`arguments` (every check of what callers pass).
`RecoverClient` is the plain class; `DLRecoverManager` adds TaskD's one-instance-per-process rule.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from taskd.client import arguments
from taskd.client.arguments import BadArgument, ClientOptions
from taskd.client.credentials import ClientCredentials
from taskd.client.dispatch import Dispatcher, SignalHandler
from taskd.client.errors import ConfigurationError, FencedError, HandedOver, RecoverClientError, ServerUnreachable
from taskd.client.retry import MIN_CALL_TIMEOUT, Backoff, ReportRetryPolicy
from taskd.client.rpc import PendingCall, RpcClient, normalize_address
from taskd.client.signals import fault_ranks_to_proto
from taskd.client.subscription import Subscription
from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Code

logger = logging.getLogger(__name__)

DEFAULT_ROLE = "master agent"  # what TaskD's agent registers as


AGENT_REPORTS = frozenset({"ReportFinished", "ReportPace", "ReportResumed", "ReportSnapshots", "ReportMigration"})
"""Methods of taskd's own taskd.v1.AgentReport service (the rest are ClusterD's Recover)."""


class RecoverClient:
    """Client of the `Recover` service for one agent of one job; several may live in one process.

    `info` identifies the agent (jobId, role, and taskd's nodeRank/nodeCount/ranksPerNode); the
    client keeps its own copy in `self.info` (host and pid filled in) and sends it with Init,
    Register and the subscription, and its jobId and nodeRank with every report. `credentials`
    (default: `ClientCredentials.from_env()`) gives the token and TLS; TaskD's `secure_conn` and
    `cert_path` still turn on TLS with that CA.
    """

    def __init__(self, info: recover_pb2.ClientInfo, server_addr: str, secure_conn: bool = False,
                 cert_path: str = "", *, credentials: ClientCredentials | None = None,
                 **options: Any) -> None:
        self._configure(info, server_addr, secure_conn, cert_path, credentials, options)

    def _configure(self, info: recover_pb2.ClientInfo, server_addr: str, secure_conn: bool, cert_path: str,
                   credentials: ClientCredentials | None, options: dict[str, Any]) -> None:
        """Check everything first, then assign: a refused argument leaves the object as it was."""
        try:
            opts = ClientOptions(**options)
        except TypeError as exc:  # an unknown keyword
            raise TypeError(f"DLRecoverManager: {exc}") from None
        info = arguments.client_info(info)
        address = normalize_address(server_addr)
        creds = ClientCredentials.from_env() if credentials is None else credentials
        if not isinstance(creds, ClientCredentials):
            raise TypeError(f"credentials must be a ClientCredentials, got {type(creds).__name__}")
        if secure_conn:  # TaskD's positional arguments: TLS, with the CA at cert_path when given
            root_ca = creds.root_ca
            if cert_path:
                root_ca = ClientCredentials.from_files(ca=cert_path, names=("", "cert_path", "", "")).root_ca
            creds = replace(creds, root_ca=root_ca, tls=True)
        self.info = self.client_info = info  # client_info: TaskD's attribute name
        self.handing_over = False  # its node passes to another agent (a node migration): a held Register is no fault
        self.server_addr = address
        self.options = opts
        self.credentials = creds
        self.frame = "pytorch"  # set by start_subscribe; informational only (see there)
        self._stopped = threading.Event()
        self.registered_with: recover_pb2.ClientInfo | None = None
        self._last_refusal: tuple[int, str] | None = None  # the last Register refused: its repeats log at debug
        self.init_refusal = ""  # "409 why" when the controller refused the Init's content (asking again cannot help)
        self.rpc = RpcClient(address, creds, opts.channel_options, call_timeout=opts.call_timeout,
                              wait_for_ready=opts.wait_for_ready)
        self._dispatcher = Dispatcher(info.jobId)
        self._subscription = Subscription(
            self.rpc, self._dispatcher, lambda: self.info, self._resync, self._new_backoff, self._stopped,
            liveness_timeout=float(opts.liveness_timeout), wait_for_ready=opts.wait_for_ready,
            handing_over=lambda: self.handing_over)

    # -- TaskD's attribute names for the options, read-only --------------------------------------

    call_timeout = property(lambda self: self.options.call_timeout)
    report_timeout = property(lambda self: self.options.report_timeout)
    liveness_timeout = property(lambda self: self.options.liveness_timeout)

    def _new_backoff(self) -> Backoff:
        return Backoff(self.options.backoff_initial, self.options.backoff_max)

    # -- job set-up ---------------------------------------------------------------------------

    def register(self, request: recover_pb2.ClientInfo | None = None, *,
                 timeout: float | None = None, adopt: bool = False) -> recover_pb2.Status:
        """Register this agent (default: `self.info`); with host and pid filled in, it is reused on every re-register.

        `adopt`: a new identity (a standby given a node) is this client's before the Register is sent, and
        stays only if it is accepted. The controller ends a standby's stream as it takes that Register, and
        the subscription re-registers at once, possibly before this call's answer is back: with the old
        identity it would register the process as a standby again, and its node's reports would go out as
        the standby's (tests/e2e/client/test_client_standby_takeover.py)."""
        request = arguments.with_identity(request if request is not None else self.info)
        before = self.info, self.registered_with

        def undo() -> None:
            if adopt:
                (self.info, self.registered_with), self.client_info = before, before[0]

        if adopt:
            self.info = self.client_info = self.registered_with = request
        try:
            status = self.rpc.call("Register", request, timeout=timeout)
        except BaseException:
            undo()
            raise
        if status.code == Code.OK:
            self.registered_with, self._last_refusal = request, None
            logger.info("registered job %s node %d with %s", request.jobId, request.nodeRank, self.server_addr)
            return status
        undo()
        if status.code == Code.FENCED:
            raise FencedError("Register", status.info)
        repeated = self._last_refusal == (status.code, status.info)
        self._last_refusal = (status.code, status.info)
        # an agent asking again for a held node (agent/link/registration.py) gets the same answer twice a second
        (logger.debug if repeated or self.handing_over else logger.warning)(
            "Register of job %s answered %d: %s", request.jobId, status.code, status.info)
        return status

    def init_clusterd(self) -> bool:
        """Init the job on the controller: True once it answers 0, False for 403 (recovery disabled)
        or when it keeps refusing; raises ServerUnreachable when it never answered at all."""
        opts = self.options
        started = time.monotonic()
        deadline = started + opts.init_timeout
        backoff = self._new_backoff()
        answered = False
        last_error: ServerUnreachable | None = None
        attempt = 0
        while attempt < opts.init_attempts and not self._stopped.is_set():
            attempt += 1
            remaining = deadline - time.monotonic()
            try:
                status = self.rpc.call("Init", self.info, timeout=max(MIN_CALL_TIMEOUT, min(opts.call_timeout,
                                                                                           remaining)))
            except ServerUnreachable as exc:
                last_error = exc
                logger.warning("Init attempt %d: %s%s", attempt, exc, "; retrying" if exc.known else "")
            else:
                answered = True
                if status.code == Code.FENCED:
                    raise FencedError("Init", status.info)
                if status.code == Code.OK:
                    logger.info("job %s initialised on %s", self.info.jobId, self.server_addr)
                    return True
                if status.code == Code.RECOVERY_DISABLED:
                    logger.warning("recovery is disabled for job %s: %s", self.info.jobId, status.info)
                    return False
                if status.code == Code.INVALID_PARAMS:  # the same request is refused the same way: say it once
                    self.init_refusal = f"{status.code} {status.info}"
                    logger.error("Init of job %s refused: %s", self.info.jobId, self.init_refusal)
                    return False
                logger.warning("Init attempt %d answered %d: %s", attempt, status.code, status.info)
            delay = backoff.next_delay()
            if time.monotonic() + delay >= deadline or self._stopped.wait(delay):
                break
        if not answered and last_error is not None and not self._stopped.is_set():
            raise ServerUnreachable(
                self.server_addr,
                f"Init failed {attempt} times in {time.monotonic() - started:.1f}s; last: {last_error.detail}",
                last_error.known,
            )
        logger.error("job %s: Init did not succeed after %d attempts", self.info.jobId, attempt)
        return False

    def health_check(self) -> recover_pb2.Status:
        """0 when the controller knows this agent, 400 otherwise."""
        return self.rpc.call("HealthCheck", self.info)

    def _resync(self) -> None:
        """Init and Register again before a new stream (blocking: the subscription runs it in a thread)."""
        if not self.init_clusterd():
            raise RecoverClientError(f"Init of job {self.info.jobId} on {self.server_addr} did not succeed")
        if self._stopped.is_set():
            raise RecoverClientError("stopped")
        status = self.register(self.registered_with or self.info)
        if status.code != Code.OK:  # refused as the node is handed over: the successor holds it, the stream ends
            refused = HandedOver if self.handing_over and status.code == Code.INVALID_PARAMS else RecoverClientError
            raise refused(f"Register on {self.server_addr} answered {status.code}: {status.info}")

    # -- reports ----------------------------------------------------------------------------

    def _report(self, method: str, build: Callable[[], Any], *, service: str = "recover",
                timeout: float | None = None, through_outages: bool = False) -> int:
        """Send, and re-send as `ReportRetryPolicy` says, within `timeout` (default `report_timeout`);
        return the final code. Blocks (sleeps between re-sends): call it from the agent's threads.
        `through_outages`: an unreachable controller is waited for (backoff, within the same budget)
        instead of raising `ServerUnreachable` at once. A 411 answer raises `FencedError`."""
        try:
            request = build()
        except BadArgument as exc:
            logger.error("%s not sent, invalid arguments: %s", method, exc)
            return int(Code.INVALID_PARAMS)
        opts = self.options
        policy = ReportRetryPolicy(opts.report_timeout if timeout is None else timeout, opts.backoff_initial,
                                   opts.backoff_max)
        started = time.monotonic()

        def remaining() -> float:
            return max(MIN_CALL_TIMEOUT, min(opts.call_timeout, policy.budget - (time.monotonic() - started)))

        answers: list[int] = []
        outage = self._new_backoff()
        while True:
            try:
                status = self.rpc.call(method, request, timeout=remaining(), service=service)
            except ServerUnreachable as exc:
                delay = outage.next_delay()
                if not through_outages or time.monotonic() - started + delay + MIN_CALL_TIMEOUT >= policy.budget:
                    raise
                logger.warning("%s: %s; re-sending in %.2fs", method, exc.detail or exc, delay)
                time.sleep(delay)
                continue
            code = int(status.code)
            if code == Code.FENCED:
                raise FencedError(method, status.info)
            decision = policy.decide(code, attempt=len(answers) + 1, elapsed=time.monotonic() - started,
                                     previous=answers, draw=random.random())
            answers.append(code)
            if not decision.retry:
                break
            logger.warning("%s answered %d; re-sending in %.2fs (%s)", method, code, decision.delay, decision.why)
            time.sleep(decision.delay)
            if decision.reinit:
                status = self.rpc.call("Init", self.info, timeout=remaining())
                logger.info("re-init of job %s answered %d %s", self.info.jobId, status.code, status.info)
            if decision.reregister:
                self.register(self.registered_with or self.info, timeout=remaining())
        if code == Code.OK:
            if len(answers) > 1:
                logger.info("%s accepted after %d attempts", method, len(answers))
            return 0
        logger.error("%s answered %d after %d attempt(s); giving up: %s", method, code, len(answers), decision.why)
        return code

    def identity(self) -> dict[str, Any]:
        """Who reports: the job, the node, and this process (host, pid), so that a report from an agent the
        controller declared lost is refused (411) once another agent holds its node."""
        info = self.registered_with or self.info
        return {"jobId": info.jobId, "nodeRank": info.nodeRank, "host": info.host, "pid": info.pid}

    # Each report's request, built (and its arguments checked: BadArgument) apart from sending it, so that the
    # blocking reports below and `start_report`'s single attempts send the same message.

    def stop_complete_request(self, code: int, msg: str, fault_ranks: dict) -> recover_pb2.StopCompleteRequest:
        return recover_pb2.StopCompleteRequest(
            status=recover_pb2.Status(code=arguments.int32(code, "code"), info=str(msg or "")),
            faultRanks=fault_ranks_to_proto(fault_ranks), **self.identity())

    def recover_strategy_request(self, fault_ranks: dict, strategy_list: list) -> recover_pb2.RecoverStrategyRequest:
        return recover_pb2.RecoverStrategyRequest(faultRanks=fault_ranks_to_proto(fault_ranks),
                                                  strategies=arguments.strategies(strategy_list), **self.identity())

    def recover_status_request(self, code: int, msg: str, fault_ranks: dict, strategy: str,
                               isolate_ranks: Iterable[int] | None = None, *, rejoined: bool = False
                               ) -> recover_pb2.RecoverStatusRequest:
        """`rejoined`: the ranks re-formed their group with the restarted ones (taskd's live recovery); the
        controller's settle window reads it (docs/controller.md)."""
        fault_ranks_to_proto(fault_ranks)
        return recover_pb2.RecoverStatusRequest(
            status=recover_pb2.Status(code=arguments.int32(code, "code"), info=str(msg or "")),
            strategy=str(strategy or ""),
            isolateRankIds=[str(arguments.int32(r, "isolate rank")) for r in (isolate_ranks or ())],
            rejoined=bool(rejoined), **self.identity())

    def process_fault_request(self, fault_ranks: dict, detail: str = "") -> recover_pb2.ProcessFaultRequest:
        return recover_pb2.ProcessFaultRequest(faultRanks=fault_ranks_to_proto(fault_ranks),
                                               detail=str(detail or ""), **self.identity())

    def finish_request(self, exit_code: int, message: str = "") -> taskd_pb2.FinishRequest:
        return taskd_pb2.FinishRequest(exitCode=arguments.int32(exit_code, "exit_code"), message=str(message or ""),
                                       **self.identity())

    def report_stop_complete(self, code: int, msg: str, fault_ranks: dict) -> int:
        """Tell the controller the faulty local ranks are stopped (code 0) or could not be."""
        return self._report("ReportStopComplete", lambda: self.stop_complete_request(code, msg, fault_ranks))

    def report_recover_strategy(self, fault_ranks: dict, strategy_list: list) -> int:
        """Offer the strategies this agent can carry out for the fault ranks of the round.

        An unknown or non-string strategy raises ValueError (naming it and the known ones) before
        anything is sent: an agent offering a misspelt strategy is misconfigured.
        """
        strategies = arguments.strategies(strategy_list)
        return self._report("ReportRecoverStrategy", lambda: self.recover_strategy_request(fault_ranks, strategies))

    def report_recover_status(self, code: int, msg: str, fault_ranks: dict, strategy: str,
                              isolate_ranks: Iterable[int] | None = None) -> int:
        """Report how carrying out `strategy` went (0 = success).

        RecoverStatusRequest has no fault-rank field (nor has ClusterD's): `fault_ranks` is kept for
        TaskD's signature and only checked; `isolate_ranks` fills `isolateRankIds`.
        """
        return self._report("ReportRecoverStatus", lambda: self.recover_status_request(
            code, msg, fault_ranks, strategy, isolate_ranks))

    def report_process_fault(self, fault_ranks: dict, fault_codes: Mapping | None = None, *,
                             detail: str = "") -> int:
        """Report ranks that died or hung: TaskD's `{global_rank: 0|1|2}` (or `FaultRanks`).

        `fault_codes` is TaskD's second argument (MindIO passes `{rank: code}`); `Recover` has no
        field for it and TaskD drops it, so here it is written into `detail` rather than lost.
        """
        return self._report("ReportProcessFault", lambda: self.process_fault_request(
            fault_ranks, arguments.fault_detail(detail, fault_codes)))

    def report_finished(self, exit_code: int, message: str = "", timeout: float | None = None) -> int:
        """Tell the controller every local rank has ended (taskd's own AgentReport service).

        `timeout` bounds the whole call (default `report_timeout`), an unreachable controller included:
        the report is re-sent until it is acknowledged, so a node that finished while the controller was
        restarting is counted finished, not lost (issue 17).
        """
        return self._report("ReportFinished", lambda: self.finish_request(exit_code, message), service="agent",
                            timeout=timeout, through_outages=True)

    # -- single attempts, for a caller that retries on its own clock (taskd's agent) -----------

    def start_report(self, method: str, request: Any, *, timeout: float,
                     on_done: Callable[[], None] | None = None) -> PendingCall:
        """One attempt at a report (a request from the `*_request` builders), started and not waited for, never
        re-sent: the caller polls the call and decides what comes next. The blocking `report_*` methods above
        are for TaskD's users; taskd's agent, whose loop must not sleep, uses this."""
        service = "agent" if method in AGENT_REPORTS else "recover"
        return self.rpc.start(method, request, timeout=timeout, service=service, on_done=on_done)

    def resync(self, *, reinit: bool, timeout: float) -> int:
        """One re-Init (when `reinit`) and one re-Register, each within `timeout`: for a caller re-sending a report
        the controller answered "unknown agent" or "unknown job" to. Returns the Register's code."""
        if reinit:
            status = self.rpc.call("Init", self.info, timeout=timeout)
            logger.info("re-init of job %s answered %d %s", self.info.jobId, status.code, status.info)
        return int(self.register(self.registered_with or self.info, timeout=timeout).code)

    # -- signals ----------------------------------------------------------------------------

    def register_action_handler(self, name: str, fn: SignalHandler | None) -> None:
        """Handle an action (`stop_train`, ...) or a signal type (`killMaster`, ...); None removes.
        An unknown name raises ValueError naming the known ones."""
        self._dispatcher.register(name, fn)

    @property
    def connected(self) -> bool:
        """True while the signal stream is open and a signal arrived within the liveness timeout."""
        return self._subscription.connected

    @property
    def last_signal_time(self) -> float | None:
        """Wall-clock time of the last signal received, or None."""
        return self._subscription.last_signal_time

    def start_subscribe(self, frame: str = "pytorch") -> None:
        """Receive and dispatch signals until stop(); blocks, so run it in its own thread.

        `frame` (TaskD's: "pytorch" or "mindspore"; anything else raises ValueError) changes nothing on
        the wire: the `Recover` service has no field for it. It is kept in `self.frame` and named in
        the subscription's log lines, so a mixed-framework cluster can be told apart there.
        """
        self.frame = arguments.frame(frame)
        if self._subscription.running:
            raise RuntimeError("start_subscribe is already running for this manager")
        logger.info("subscribing to signals of job %s at %s (frame %s)", self.info.jobId, self.server_addr,
                    self.frame)
        try:
            self._subscription.run(need_sync=self.registered_with is None)
        finally:
            logger.info("signal subscription of job %s (frame %s) stopped", self.info.jobId, self.frame)

    def stop(self) -> None:
        """End start_subscribe promptly and close the channel; safe from any thread, idempotent."""
        self._stopped.set()
        self._subscription.stop()
        self.rpc.close()

    close = stop

    def __enter__(self) -> RecoverClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class DLRecoverManager(RecoverClient):
    """TaskD's class: one instance per process, which the module functions find.

    As in TaskD, `DLRecoverManager(...)` always returns the same object, and a second construction
    applies its arguments to it. Here that re-configuration happens only when it is safe and needed:
    with the same arguments, a live instance is returned untouched (its registration and handlers
    kept); with other arguments, or after stop(), it is re-initialised in place (handlers cleared,
    like a new object), unless its subscription is still running, which raises RuntimeError. Several
    clients in one process (tests, simulators) use `RecoverClient`; `reset_instance()` forgets the one.

    `instance` is TaskD's class attribute: the object, or None. TaskD's own tests reset it with
    `DLRecoverManager.instance = None`; the next construction (or module function) then builds a
    new object, and the old one is left to whoever holds it.
    """

    instance: DLRecoverManager | None = None
    _instance_lock = threading.RLock()

    def __new__(cls, *args: Any, **kwargs: Any) -> DLRecoverManager:
        with DLRecoverManager._instance_lock:
            if DLRecoverManager.instance is None:
                DLRecoverManager.instance = super().__new__(cls)
            return DLRecoverManager.instance

    def __init__(self, info: recover_pb2.ClientInfo, server_addr: str, secure_conn: bool = False,
                 cert_path: str = "", *, credentials: ClientCredentials | None = None, **options: Any) -> None:
        with DLRecoverManager._instance_lock:
            key = _arguments_key(info, server_addr, secure_conn, cert_path, credentials, options)
            if getattr(self, "_key", None) == key and not self._stopped.is_set():
                return
            previous = getattr(self, "_subscription", None)
            if previous is not None:
                if previous.running and not self._stopped.is_set():
                    raise RuntimeError(
                        "DLRecoverManager is TaskD's one-per-process client and its subscription is running: "
                        "stop() it before constructing it with other arguments, or use "
                        "taskd.client.RecoverClient for another client")
                self.stop()
                _wait_until_stopped(previous)
            try:
                self._configure(info, server_addr, secure_conn, cert_path, credentials, options)
            except Exception:
                if previous is None:  # never configured: do not leave a half-built instance behind
                    DLRecoverManager.instance = None
                raise
            self._key = key

    @classmethod
    def reset_instance(cls) -> None:
        """Stop and forget the process's instance: the next construction makes a new object (tests)."""
        with DLRecoverManager._instance_lock:
            current, DLRecoverManager.instance = DLRecoverManager.instance, None
        if current is not None and hasattr(current, "_stopped"):
            current.stop()


def pace_request(client: RecoverClient, factor: float, paces: Iterable[tuple[int, float, int]]
                 ) -> taskd_pb2.PaceRequest:
    """A node's ranks' recent pace for taskd.v1 `ReportPace`: (global rank, compute seconds per step, steps
    averaged) each, from the client's registered identity."""
    return taskd_pb2.PaceRequest(factor=float(factor), ranks=[
        taskd_pb2.RankPace(rank=arguments.int32(r, "rank"), computeSeconds=float(s),
                           steps=arguments.int32(n, "steps")) for r, s, n in paces], **client.identity())


def resumed_request(client: RecoverClient, round_: int, seconds: float, seconds_ago: float, unseen: bool = False,
                    restores: Iterable[Any] = ()) -> taskd_pb2.ResumedRequest:
    """taskd.v1 `ReportResumed`: this node's ranks train again after the controller's round `round_`, `seconds`
    after its fault, `seconds_ago` before now (`unseen`: nothing here can tell), where each restarted rank restored
    from (`restores`: rank, source, step, redone), from the registered identity."""
    return taskd_pb2.ResumedRequest(round=arguments.int32(round_, "round"), seconds=float(seconds),
                                    secondsAgo=float(seconds_ago), unseen=bool(unseen), restores=[taskd_pb2.RankRestore(
                                        rank=r.rank, source=r.source, step=r.step,
                                        stepsRedone=-1 if r.redone is None else r.redone) for r in restores],
                                    **client.identity())


def migration_request(client: RecoverClient, **fields: object) -> taskd_pb2.MigrationReport:
    """taskd.v1 `ReportMigration`: how a planned migration of this node's rank ended, from the registered identity."""
    return taskd_pb2.MigrationReport(**fields, **client.identity())


def _arguments_key(info: object, server_addr: str, secure_conn: bool, cert_path: str,
                   credentials: ClientCredentials | None, options: dict[str, Any]) -> tuple:
    wire = info.SerializeToString(deterministic=True) if isinstance(info, recover_pb2.ClientInfo) else repr(info)
    return wire, server_addr, bool(secure_conn), cert_path, credentials, sorted(options.items(), key=repr)


def _wait_until_stopped(subscription: Subscription, timeout: float = 10.0) -> None:
    """A stopped subscription winds down within a call deadline; wait for it before re-using the object."""
    deadline = time.monotonic() + timeout
    while subscription.running:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the previous DLRecoverManager subscription did not end within {timeout:.0f}s")
        time.sleep(0.01)


__all__ = ["DEFAULT_ROLE", "ConfigurationError", "DLRecoverManager", "RecoverClient"]
