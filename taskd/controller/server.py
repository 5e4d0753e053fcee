"""The controller process: config, a server with a clear lifecycle, and two ways to run it.

- `run_server(config)`: `taskd server`; serves until SIGTERM/SIGINT, then shuts down gracefully.
- `EmbeddedController(config)`: the same server on its own event loop in a daemon thread, for
  `taskd run` and for MSRunPlugin when no controller address is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
from dataclasses import dataclass, field, fields
from typing import Any

import grpc

from taskd.address import join_host_port, parse_host_port
from taskd.controller.core import ControllerCore
from taskd.controller.hub import SignalHub
from taskd.controller.service import add_services
from taskd.controller.state_machine import MachineConfig
from taskd.controller.store import MEMORY, Store
from taskd.vocabulary import DEFAULT_PORT

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024 * 1024
LISTEN_HINT = "is the port taken or the address not this host's? pass --listen HOST:PORT (port 0 = any free port)"
LISTEN_FORMS = "expected HOST:PORT, [IPV6]:PORT, a bare IPv6 address or a bare HOST (port 0 = any free port)"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


def parse_listen(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """`host:port`, `[v6]:port`, `[v6]`, a bare `v6` or a bare `host` -> (host without brackets, port);
    ValueError saying what is wrong otherwise (0.0.0.0:PORT serves every interface)."""
    return parse_host_port(text, default_port, what="listen address", forms=LISTEN_FORMS, port_zero=True)


@dataclass(frozen=True)
class ControllerConfig(MachineConfig):
    """Everything `taskd server` can be told; the CLI only parses flags into this. The recovery
    timeouts and policy defaults are `MachineConfig`'s fields, inherited rather than repeated."""

    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    state_path: str | None = None  # None = default_state_path(); ":memory:" keeps nothing
    keepalive_interval: float = 5.0
    max_jobs: int = 10000
    # a finished (SUCCEEDED/FAILED) job with no agent streaming or calling for this long is forgotten,
    # in memory and in the state file; a full table evicts the longest idle finished job early
    finished_job_retention: float = 3600.0
    subscriber_queue_size: int = 1024
    # Calls gRPC core has received but the event loop has not picked up yet: above the soft limit some
    # are refused, above the hard limit all (defaults 1000/3000), and one left waiting longer than
    # `max_unrequested_seconds` (default 30) is cancelled. The agent sees CANCELLED for all three (grpcio
    # 1.71, checked with a blocked loop). A controller restart makes every agent reconnect at once
    # (one call in flight per agent), so keep the limits above the agent count and let a queued call
    # wait rather than be cancelled and retried after a backoff.
    max_pending_requests: int = 20000
    max_pending_requests_hard_limit: int = 60000
    max_unrequested_seconds: int = 300
    grace: float = 5.0
    extra_options: list[tuple[str, Any]] = field(default_factory=list)

    def machine_config(self) -> MachineConfig:
        """Only the state machine's part (what each `JobMachine` holds)."""
        return MachineConfig(**{f.name: getattr(self, f.name) for f in fields(MachineConfig)})

    def grpc_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.server.max_pending_requests", self.max_pending_requests),
            ("grpc.server.max_pending_requests_hard_limit", self.max_pending_requests_hard_limit),
            ("grpc.server_max_unrequested_time_in_server", self.max_unrequested_seconds),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            # clients ping every few seconds even without calls: allow it instead of GOAWAY(too_many_pings)
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
            # and find dead agents' connections ourselves
            ("grpc.keepalive_time_ms", 20000),
            ("grpc.keepalive_timeout_ms", 10000),
            ("grpc.so_reuseport", 0),
            *self.extra_options,
        ]


class ControllerServer:
    """start() binds and serves; wait() until stopped; stop(grace) closes streams and the store."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.core: ControllerCore | None = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._port = 0
        self._stopped: asyncio.Event | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        """Where a client on this host reaches the server (a wildcard listen address -> loopback)."""
        host, _ = parse_listen(self.config.listen)
        if host in WILDCARD_HOSTS:
            host = "127.0.0.1"
        return join_host_port(host, self._port)

    async def start(self) -> None:
        """Bind, then open the state: a taken port leaves no state file (nor lock) behind.
        ValueError for a malformed listen address, OSError for a bind or state file that fails."""
        cfg = self.config
        host, port = parse_listen(cfg.listen)
        listen = join_host_port(host, port)
        self._stopped = asyncio.Event()
        server = grpc.aio.server(options=cfg.grpc_options())
        try:
            bound = server.add_insecure_port(listen)
        except RuntimeError as exc:
            await _release(server)
            raise OSError(f"cannot listen on {listen}: {exc}; {LISTEN_HINT}") from exc
        if bound == 0:  # older grpcio answered 0 instead of raising
            await _release(server)
            raise OSError(f"cannot listen on {listen}; {LISTEN_HINT}")
        try:
            store = Store(cfg.state_path)
        except BaseException:
            await _release(server)  # the port is free again for a retry with another --state
            raise
        try:
            hub = SignalHub(cfg.subscriber_queue_size)
            self.core = ControllerCore(cfg.machine_config(), store, hub, max_jobs=cfg.max_jobs,
                                       finished_job_retention=cfg.finished_job_retention)
            self.core.load()
            add_services(server, self.core)
        except BaseException:
            await _release(server)
            store.close()
            raise
        try:
            await server.start()
        except BaseException:
            await server.stop(None)
            store.close()
            raise
        self._port = bound
        self._server = server
        self._tasks = [
            asyncio.create_task(self.core.run_timer(), name="taskd-deadlines"),
            asyncio.create_task(hub.run_keepalive(cfg.keepalive_interval), name="taskd-keepalive"),
            asyncio.create_task(self.core.run_eviction(), name="taskd-eviction"),
        ]
        log.info("taskd controller listening on %s (state %s, %d job(s) loaded)", self.address,
                 store.path, len(self.core.jobs))

    async def wait(self) -> None:
        """Until stop() has finished."""
        assert self._stopped is not None, "start() first"
        await self._stopped.wait()

    async def stop(self, grace: float | None = None) -> None:
        if self._server is None or self.core is None:
            return
        server, self._server = self._server, None
        self.core.closing = True
        # gRPC first stops taking calls, then the streams end: agents that reconnect at once must not
        # open new streams here (each would hang until the grace period ended: 7 s at 10,000 agents)
        stopping = asyncio.ensure_future(server.stop(self.config.grace if grace is None else grace))
        await asyncio.sleep(0.05)
        self.core.hub.close_all("controller shutting down")
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await stopping
        try:
            self.core.flush_soft()
        except Exception:  # soft history only; the state itself was committed event by event
            log.exception("could not write the last stream history")
        self.core.store.close()
        log.info("taskd controller on %s stopped", self.address)
        assert self._stopped is not None
        self._stopped.set()


async def _release(server: grpc.aio.Server) -> None:
    """Let go of the ports of a server that never served. grpc keeps a bound port until the server has
    been started and stopped (stop alone, or dropping it, holds the port for the life of the process);
    a server with no handlers started for a moment answers UNIMPLEMENTED, and nobody knows its port yet."""
    with contextlib.suppress(Exception):
        await server.start()
    await server.stop(None)


GC_THRESHOLDS = (50_000, 20, 10)
"""The standalone controller's cyclic-GC thresholds (Python's are 700, 10, 10). With 10,000 streams the
heap holds ~10^6 long-lived objects; at the default rate a full collection (0.3 s at 10,000 agents)
ran 15 times in a minute of subscribing and fanning out, stalling every stream while it ran."""


def tune_gc() -> None:
    """For a process that is only a controller: objects from startup (modules, descriptors) are frozen
    out of collections, and collections run after 50,000 net allocations instead of 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(config: ControllerConfig, ready: Any = None) -> None:
    """Serve until SIGTERM/SIGINT (main thread) and shut down gracefully; `ready(server)` after start."""
    server = ControllerServer(config)
    await server.start()
    tune_gc()
    if ready is not None:
        ready(server)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        await stop_requested.wait()
        log.info("shutting down")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()


def run_server(config: ControllerConfig, ready: Any = None) -> int:
    """Blocking entry point of `taskd server`; returns the exit code."""
    asyncio.run(serve(config, ready))
    return 0


class EmbeddedController:
    """A controller running on its own event loop in a daemon thread of this process."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig(listen="127.0.0.1:0", state_path=MEMORY)
        self.server: ControllerServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._address = ""

    @property
    def address(self) -> str:
        return self._address

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; returns "127.0.0.1:<port>". Raises what the server raised on startup."""
        if self._thread is not None:
            return self._address
        self._thread = threading.Thread(target=self._run, name="taskd-controller", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"embedded controller did not start within {timeout}s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._error
        return self._address

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("embedded controller did not stop within %ss", timeout)
        self._thread = None

    def __enter__(self) -> EmbeddedController:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start()
            if not self._ready.is_set():
                self._error = exc
            else:
                log.exception("embedded controller crashed")
        finally:
            self._ready.set()
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = ControllerServer(self.config)
        await server.start()
        self.server = server
        self._address = server.address
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await server.stop(min(self.config.grace, 1.0))
