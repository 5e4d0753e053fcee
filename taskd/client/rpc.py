"""The RPC client: the controller's address, the gRPC channels, and unary calls with deadlines.

Every call carries the credentials' metadata (the bearer token) explicitly, here and on the signal
stream (taskd/client/subscription.py): two call sites, no interceptor layer whose cancellation
semantics differ between grpc and grpc.aio. TLS is the channel's, built from the same credentials.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from taskd.address import CONTROLLER_FORMS, controller_target
from taskd.client.credentials import NO_CREDENTIALS, ClientCredentials
from taskd.client.errors import AuthenticationError, ConfigurationError, RecoverClientError, ServerUnreachable
from taskd.proto import recover_pb2_grpc, taskd_pb2_grpc
from taskd.settings import default
from taskd.vocabulary import DEFAULT_PORT

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

ChannelOptions = list[tuple[str, int | str]] | tuple[tuple[str, int | str], ...]

# Keepalive pings detect a dead controller or a dropped NAT entry within seconds even while
# the signal stream is idle; the reconnect backoff is capped so that an agent finds a
# restarted controller quickly (gRPC's default cap is two minutes).
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 3000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 3000),
)

ADDRESS_FORMS = CONTROLLER_FORMS
UNREACHABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def normalize_address(server_addr: str, default_port: int = DEFAULT_PORT) -> str:
    """`host`, `host:port`, `[v6]`, `[v6]:port` or a bare `v6` -> a gRPC target with an explicit port (the same
    parser as `taskd server --listen`); ConfigurationError saying what is wrong."""
    try:
        return controller_target(server_addr, default_port)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def is_loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_channel(
    target: str,
    extra_options: ChannelOptions = (),
    credentials: ClientCredentials | grpc.ChannelCredentials | None = None,
    *,
    aio: bool = False,
) -> grpc.Channel | grpc.aio.Channel:
    """A channel with the default options; `extra_options` override entries of the same name.

    `credentials` decides TLS (a `ClientCredentials` or gRPC's own channel credentials). The token is
    not the channel's: pass `metadata=credentials.metadata()` on each call (`RpcClient` does).
    `aio=True` gives the grpc.aio twin; create it on the loop that uses it.
    """
    options: dict[str, int | str] = dict(DEFAULT_CHANNEL_OPTIONS)
    options.update(dict(extra_options))
    if isinstance(credentials, ClientCredentials):
        credentials = credentials.channel_credentials()
    module = grpc.aio if aio else grpc
    if credentials is not None:
        return module.secure_channel(target, credentials, options=list(options.items()))
    return module.insecure_channel(target, options=list(options.items()))


def translate(exc: grpc.RpcError, method: str, target: str, known: bool = False) -> RecoverClientError:
    """A gRPC failure as the client's exception: unreachable, refused credentials, or other (`known`: the
    controller there answered this client before; see ServerUnreachable)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "UNKNOWN"
    if code in UNREACHABLE_CODES:
        return ServerUnreachable(target, f"{method}: {name}: {details}", known)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):  # a job credential for
        return AuthenticationError(target, f"{method}: {details}")  # another job: retrying cannot help either
    return RecoverClientError(f"{method} to {target} failed: {name}: {details}")


class PendingCall:
    """A unary call in flight (gRPC's future): `done()` never blocks; `result()` once it is done."""

    def __init__(self, future: grpc.Future, method: str, target: str, owner: RpcClient | None = None) -> None:
        self._future = future
        self.method = method
        self.target = target
        self._owner = owner  # told of an answer; says whether the controller answered before

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> Any:
        """The answer of a completed call; a failed call raises the client's exception (as `RpcClient.call`)."""
        try:
            answer = self._future.result(timeout=0)
        except grpc.RpcError as exc:
            known = self._owner is not None and self._owner.answered
            raise translate(exc, self.method, self.target, known) from None
        except grpc.FutureCancelledError:
            raise RecoverClientError(f"{self.method} to {self.target} was cancelled") from None
        except grpc.FutureTimeoutError:
            raise RecoverClientError(f"{self.method} to {self.target} is still in flight") from None
        if self._owner is not None:
            self._owner.answered = True
        return answer

    def cancel(self) -> None:
        self._future.cancel()


class RpcClient:
    """The synchronous channel and its stubs, opened lazily and again after `close()` (reports still
    work after a manager's stop()); any thread may call."""

    def __init__(self, target: str, credentials: ClientCredentials = NO_CREDENTIALS,
                 channel_options: ChannelOptions = (), *, call_timeout: float = default("call_timeout"),
                 wait_for_ready: bool = default("wait_for_ready")) -> None:
        self.target = target
        self.credentials = credentials
        self.metadata = credentials.metadata()
        self.channel_options = tuple(channel_options)
        self.call_timeout = call_timeout
        self.wait_for_ready = wait_for_ready
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self.answered = False  # a call (or the signal stream) got an answer from the controller at least once
        if credentials.token and not credentials.tls and not is_loopback(target):
            logger.warning("sending the taskd token to %s without TLS: anyone on the path can read it "
                           "(set TASKD_TLS_CA, and start the server with --tls-cert/--tls-key)", target)

    def _stub(self, service: str, reopen: bool) -> Any:
        with self._lock:
            if self._channel is None:
                if not reopen:
                    raise RecoverClientError(f"the channel to {self.target} was closed")
                self._channel = make_channel(self.target, self.channel_options, self.credentials)  # type: ignore[assignment]
                self._stubs = {
                    "recover": recover_pb2_grpc.RecoverStub(self._channel),
                    "agent": taskd_pb2_grpc.AgentReportStub(self._channel),
                }
            return self._stubs[service]

    def call(self, method: str, request: Any, *, timeout: float | None = None, service: str = "recover",
             reopen: bool = True) -> Any:
        """One unary call with a deadline (`call_timeout` unless given); gRPC errors become client errors."""
        rpc = getattr(self._stub(service, reopen), method)
        try:
            answer = rpc(request, timeout=timeout or self.call_timeout, metadata=self.metadata,
                         wait_for_ready=self.wait_for_ready)
        except grpc.RpcError as exc:
            raise translate(exc, method, self.target, self.answered) from None
        except ValueError as exc:  # the channel was closed by close() in another thread
            raise RecoverClientError(f"{method} to {self.target} failed: {exc}") from None
        self.answered = True
        return answer

    def start(self, method: str, request: Any, *, timeout: float, service: str = "recover",
              on_done: Callable[[], None] | None = None) -> PendingCall:
        """One unary call started and not waited for: the caller polls the `PendingCall` (`on_done`, called on
        a gRPC thread when it completes, can wake the caller's loop)."""
        rpc = getattr(self._stub(service, reopen=True), method)
        try:
            future = rpc.future(request, timeout=timeout, metadata=self.metadata, wait_for_ready=self.wait_for_ready)
        except ValueError as exc:  # the channel was closed by close() in another thread
            raise RecoverClientError(f"{method} to {self.target} failed: {exc}") from None
        call = PendingCall(future, method, self.target, self)
        if on_done is not None:
            future.add_done_callback(lambda _future: on_done())
        return call

    def aio_channel(self) -> grpc.aio.Channel:
        """A grpc.aio channel with the same target, options and TLS; call it on the loop that uses it."""
        return make_channel(self.target, self.channel_options, self.credentials, aio=True)  # type: ignore[return-value]

    def close(self) -> None:
        """Close the channel (cancelling calls in flight); the next `call` opens a new one."""
        with self._lock:
            channel, self._channel, self._stubs = self._channel, None, {}
        if channel is not None:
            channel.close()
