"""The server interceptor every call of every service passes: token, limits, decodable request.

The token is checked on the call's metadata, before its body is read: an unauthenticated call is
answered by a handler that never reads its request (gRPC reads a unary request whole before the
servicer runs, so a caller without the token could otherwise make the server buffer 4 MB per call,
RELIABILITY.md "N3"). It still counts against its peer's call rate. An authenticated call then
passes the per-peer limits; a request that does not decode gets INVALID_ARGUMENT (gRPC would answer
UNKNOWN after logging a traceback) and one rate-limited log line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from taskd.controller.service.auth import STATUS_METHODS, STATUS_READER, authenticate, token_refusal
from taskd.controller.service.limits import PeerLimits, peer_ip
from taskd.controller.service.tenancy import Tenants, credential_key
from taskd.vocabulary import Code

log = logging.getLogger(__name__)


class RateLimitedLog:
    """At most one line per `kind` every `interval` seconds; the lines held back are counted in the next."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, kind: str, msg: str, *args: object) -> bool:
        now = self.clock()
        if now - self._last.get(kind, -self.interval) < self.interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more like it in the last {self.interval:g}s not shown)" if held else ""
        self.logger.warning(msg + suffix, *args)
        return True


class Undecodable:
    """What a request deserializer returns for bytes that are not the request type."""

    __slots__ = ("error", "size")

    def __init__(self, error: str, size: int) -> None:
        self.error = error
        self.size = size


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, bad UTF-8 in a string field, ...
            return Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}", len(data))

    return deserialize


def _both(first: Callable[[], None] | None, second: Callable[[], None] | None) -> Callable[[], None] | None:
    if first is None or second is None:
        return first or second

    def release() -> None:
        first()
        second()

    return release


class Guard(aio.ServerInterceptor):
    """Wraps each method's handler once (cached by method name); the checks run per call."""

    def __init__(self, token: str | None, limits: PeerLimits | None, tenants: Tenants | None = None) -> None:
        """`tenants`: each authenticated call's connection is bound to its credential there, and refused past
        the credential's connection cap (tenancy.py)."""
        self._token = token.encode() if token is not None else None
        self._limits = limits
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}
        self._refusals: dict[tuple[str, bool], grpc.RpcMethodHandler] = {}
        self._tenants = tenants
        self.note = RateLimitedLog(log)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if self._token is not None and (why := token_refusal(handler_call_details.invocation_metadata, self._token)):
            return self._refusal(method, why, method.endswith("/SubscribeProcessManageSignal"))
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:  # unknown method: UNIMPLEMENTED; no client streams here
            return handler
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = wrapped
        return wrapped

    def _job_refusal(self, method: str, request: Any, job: str | None) -> str:
        """"" for the admin token, a job credential whose job the request names, or the status credential on
        `ListJobs`; else why not."""
        if job is None:
            return ""
        if job == STATUS_READER:
            return "" if method in STATUS_METHODS else (
                f"a status credential (an embedded controller's locator holds one) only reads jobs: {method} "
                "needs the agent's own token or the job's credential")
        named = getattr(request, "jobId", "")
        if named == job:
            return ""
        if not named:
            return (f"a job credential reads and changes only its own job ({job!r}): {method} must name it in "
                    "jobId; listing every job needs the admin token")
        return (f"this credential is for job {job!r} and the call names job {named!r}: each job's agents need "
                "that job's credential (`taskd token --job ID`)")

    def _refusal(self, method: str, why: str, streaming: bool) -> grpc.RpcMethodHandler:
        """A request-streaming handler: gRPC hands it the call without reading the request, so the
        refusal costs the headers only, and whatever body arrives is dropped with the stream."""
        key = (why, streaming)
        handler = self._refusals.get(key)
        if handler is not None:
            return handler
        limits, note = self._limits, self.note

        async def refuse(requests: Any, context: aio.ServicerContext) -> Any:
            peer = context.peer()
            if limits is not None:
                over, release = limits.admit(peer, False)  # an unauthenticated flood spends the peer's calls too
                if release is not None:
                    release()
                if over:
                    note("limit", "refused %s from %s: %s", method, peer, over)
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{Code.RATE_LIMITED}: {over}")
            note("auth", "refused %s from %s: %s", method, peer_ip(peer), why.split(":")[0])
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        if streaming:
            async def refuse_stream(requests: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
                await refuse(requests, context)
                yield b""  # never reached: abort raised

            handler = grpc.stream_stream_rpc_method_handler(refuse_stream)
        else:
            handler = grpc.stream_unary_rpc_method_handler(refuse)
        if len(self._refusals) < 64:  # a handful of distinct reasons; never one per caller
            self._refusals[key] = handler
        return handler

    def _wrap(self, method: str, handler: Any) -> Any:
        gate = self._gate
        if handler.response_streaming:
            inner_stream = handler.unary_stream

            async def unary_stream(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
                release = await gate(method, request, context, True)
                try:
                    async for item in inner_stream(request, context):
                        yield item
                finally:
                    if release is not None:
                        release()

            return handler._replace(unary_stream=unary_stream, request_deserializer=_safe(handler.request_deserializer))
        inner = handler.unary_unary

        async def unary_unary(request: Any, context: aio.ServicerContext) -> Any:
            release = await gate(method, request, context, False)
            try:
                return await inner(request, context)
            finally:
                if release is not None:
                    release()

        return handler._replace(unary_unary=unary_unary, request_deserializer=_safe(handler.request_deserializer))

    async def _gate(self, method: str, request: Any, context: aio.ServicerContext, stream: bool
                    ) -> Callable[[], None] | None:
        release = None
        if self._limits is not None:
            peer = context.peer()
            why, release = self._limits.admit(peer, stream)
            if why:
                self.note("limit", "refused %s from %s: %s", method, peer, why)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{Code.RATE_LIMITED}: {why}")
        job = authenticate(context.invocation_metadata(), self._token)[1] if self._token is not None else None
        if self._tenants is not None:
            why, held = self._tenants.admit(context.peer(), credential_key(job) if self._token is not None else None)
            if why:
                if release is not None:
                    release()
                self.note("tenant", "refused %s from %s: %s", method, peer_ip(context.peer()), why)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{Code.RATE_LIMITED}: {why}")
            release = _both(release, held)
        try:
            if isinstance(request, Undecodable):
                self.note("decode", "refused %s from %s: %d bytes that do not decode (%s)", method,
                          peer_ip(context.peer()), request.size, request.error)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{Code.INVALID_PARAMS}: the request to {method} does not decode: {request.error}")
            if self._token is not None and (why := self._job_refusal(method, request, job)):
                self.note("job", "refused %s from %s: %s", method, peer_ip(context.peer()), why)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        except BaseException:
            if release is not None:
                release()
            raise
        return release
