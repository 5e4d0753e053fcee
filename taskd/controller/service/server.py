"""The controller process: config, a server with a clear lifecycle, and two ways to run it.

- `run_server(config)`: `taskd server`; serves until SIGTERM/SIGINT, then shuts down gracefully.
- `EmbeddedController(config)`: the same server on its own event loop in a daemon thread, for
  `taskd run` and for MSRunPlugin when no controller address is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from taskd.address import join_host_port
from taskd.controller.config import (
    MAX_MESSAGE,
    METRICS_PORT,
    WILDCARD_HOSTS,
    ConfigError,
    ControllerConfig,
    is_loopback,
    parse_listen,
)
from taskd.controller.core import ControllerCore
from taskd.controller.locator import remove_locator, write_locator
from taskd.controller.machine.model import TERMINAL
from taskd.controller.service.auth import job_credential, server_credentials, status_credential
from taskd.controller.service.connections import ConnectionWatch, WatchConfig
from taskd.controller.service.guard import Guard, RateLimitedLog
from taskd.controller.service.hub import SignalHub
from taskd.controller.service.limits import PeerLimitConfig, PeerLimits, connection_budget, raise_nofile
from taskd.controller.service.native_log import NativeLogFilter
from taskd.controller.service.servicers import add_services
from taskd.controller.service.tenancy import default_cap, fair_share
from taskd.controller.storage.store import MEMORY, Store
from taskd.settings import env_text, setting

if TYPE_CHECKING:
    from taskd.controller.metrics import ControllerMetrics

log = logging.getLogger(__name__)

__all__ = ["MAX_MESSAGE", "ConfigError", "ControllerConfig", "ControllerServer", "EmbeddedController", "parse_listen",
           "run_server", "serve"]

LISTEN_HINT = "is the port taken or the address not this host's? pass --listen HOST:PORT (port 0 = any free port)"


class ControllerServer:
    """start() binds and serves; wait() until stopped; stop(grace) closes streams and the store."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.core: ControllerCore | None = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._port = 0
        self._stopped: asyncio.Event | None = None
        self.watch: ConnectionWatch | None = None
        self._exporter: Any = None  # the metrics HTTP server (controller/metrics.py), shut down at stop

    @property
    def port(self) -> int:
        return self._port

    @property
    def metrics_port(self) -> int:
        """The port the Prometheus exporter bound (0: none), e.g. for `--metrics-listen 127.0.0.1:0`."""
        return self._exporter.server_port if self._exporter is not None else 0

    def _metrics(self, hub: SignalHub) -> ControllerMetrics | None:
        if self.config.metrics_listen is None:
            return None
        from taskd.controller.metrics import ControllerMetrics

        return ControllerMetrics(lambda: self.core.jobs.values() if self.core is not None else (), hub.stream_count)

    def _fair_share(self, credential: str) -> int:
        """A tenant's fair share of connections under pressure (tenancy.fair_share)."""
        return fair_share(credential, self._job_size)

    def _job_size(self, job_id: str) -> int | None:
        job = self.core.jobs.get(job_id) if self.core is not None else None
        return len(job.agents) + len(job.standbys) if job is not None else None

    @property
    def address(self) -> str:
        """Where a client on this host reaches the server (a wildcard listen address -> loopback)."""
        host, _ = parse_listen(self.config.listen)
        if host in WILDCARD_HOSTS:
            host = "127.0.0.1"
        return join_host_port(host, self._port)

    async def start(self, max_connections: int | None = None) -> None:
        """Bind, then open the state: a taken port leaves no state file (nor lock) behind.
        OSError for a bind, TLS file or state file that fails. `max_connections` (default: the config's,
        else what RLIMIT_NOFILE allows) caps the connections gRPC accepts."""
        cfg = self.config
        host, port = parse_listen(cfg.listen)
        listen = join_host_port(host, port)
        self._stopped = asyncio.Event()
        token = cfg.load_token()
        credentials = server_credentials(cfg)
        limits = PeerLimits(PeerLimitConfig(
            max_connections=cfg.max_connections_per_peer, max_streams=cfg.max_streams_per_peer,
            calls_per_second=cfg.calls_per_second_per_peer, burst=cfg.call_burst_per_peer,
            limit_loopback=cfg.limit_loopback))
        budget = cfg.max_connections or max_connections or connection_budget()
        hub = SignalHub(cfg.subscriber_queue_size)
        metrics = self._metrics(hub)
        watch_note = RateLimitedLog(logging.getLogger("taskd.controller.service.connections"))
        cap = default_cap(budget) if cfg.max_connections_per_credential is None else cfg.max_connections_per_credential
        watch = ConnectionWatch(WatchConfig(port=0, auth_timeout=cfg.auth_timeout,
                                            max_per_peer=cfg.max_connections_per_peer,
                                            soft_budget=max(1, budget * 9 // 10), budget=budget,
                                            limit_loopback=cfg.limit_loopback),
                                note=metrics.counting(watch_note) if metrics is not None else watch_note,
                                cap=cap, fair=self._fair_share)
        guard = Guard(token, limits, watch.tenants)
        if metrics is not None:
            guard.note = metrics.counting(guard.note)
        server = grpc.aio.server(options=cfg.grpc_options(budget), interceptors=[guard])
        try:
            bound = (server.add_secure_port(listen, credentials) if credentials is not None
                     else server.add_insecure_port(listen))
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
            self.core = ControllerCore(cfg.machine_config(), store, hub, max_jobs=cfg.max_jobs,
                                       finished_job_retention=cfg.finished_job_retention,
                                       max_job_bytes=cfg.max_job_bytes, job_log_lines=cfg.max_job_log_lines)
            self.core.metrics = metrics
            self.core.load()
            add_services(server, self.core, cfg.max_node_count, cfg.max_ranks,
                         functools.partial(job_credential, token) if token is not None else None)
        except BaseException:
            await _release(server)
            store.close()
            raise
        try:
            await server.start()
            if metrics is not None and cfg.metrics_listen is not None:
                m_host, m_port = parse_listen(cfg.metrics_listen, METRICS_PORT)
                try:
                    self._exporter = metrics.serve(m_host, m_port)
                except OSError as exc:
                    raise OSError(f"--metrics-listen {cfg.metrics_listen}: cannot listen there "
                                  f"({exc.strerror or exc}): give a free port, or drop the flag") from None
                log.info("Prometheus metrics at http://%s/metrics", join_host_port(m_host, self._exporter.server_port))
        except BaseException:
            await server.stop(None)
            store.close()
            raise
        self._port = bound
        self._server = server
        watch.config = dataclasses.replace(watch.config, port=bound)
        self.watch = watch
        self._tasks = [
            asyncio.create_task(watch.run(), name="taskd-connections"),
            asyncio.create_task(self.core.run_timer(), name="taskd-deadlines"),
            asyncio.create_task(hub.run_keepalive(cfg.keepalive_interval), name="taskd-keepalive"),
            asyncio.create_task(self.core.run_eviction(), name="taskd-eviction"),
        ]
        log.info("taskd controller listening on %s%s (state %s, %d job(s) loaded; %s, %s; up to %d connections)",
                 join_host_port(host, bound), f" (every interface; clients on this host use {self.address})"
                 if host in WILDCARD_HOSTS else "", store.path, len(self.core.jobs),
                 "TLS" if credentials is not None else "plaintext",
                 "token required" if token is not None else "no token", budget)
        if token is not None:
            log.info("each credential may hold up to %s connections (--max-connections-per-credential)",
                     cap or "any number of")
        if token is None and not is_loopback(host):
            log.warning("serving %s without a token (--insecure): anyone who can reach it can read, fail or stop "
                        "every job", join_host_port(host, bound))

    async def wait(self) -> None:
        """Until stop() has finished."""
        assert self._stopped is not None, "start() first"
        await self._stopped.wait()

    async def stop(self, grace: float | None = None) -> None:
        if self._server is None or self.core is None:
            return
        server, self._server = self._server, None
        self.core.closing = True
        if self._exporter is not None:
            self._exporter.shutdown()
            self._exporter.server_close()
            self._exporter = None
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
        self.core.group.flush()  # reports handled in the last loop turn (their callers are gone, not their change)
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


REJOIN_ENV = setting("node_rejoin_timeout").env


def rejoin_timeout_from_env() -> float:
    """$TASKD_NODE_REJOIN_TIMEOUT in seconds (the agent reads the same bound), else ControllerConfig's default;
    ConfigError naming the variable for one that is not a number."""
    text = env_text("node_rejoin_timeout")
    if not text:
        return ControllerConfig.node_rejoin_timeout
    try:
        return float(text)
    except ValueError:
        raise ConfigError([f"{REJOIN_ENV}={text[:40]!r} is not a number of seconds"]) from None


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
    # SIGTERM is taken over before the port opens: one that arrives while startup still runs (tune_gc holds
    # the GIL for a while on a loaded machine) shuts down gracefully instead of killing the process with its
    # log lines still in native_log's pipe (a CI run lost every line after startup that way)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        # the standalone controller's only job is serving: every descriptor the hard limit allows is its own
        await server.start(max_connections=connection_budget(raise_nofile()))
        tune_gc()
        if ready is not None:
            ready(server)
        await stop_requested.wait()
        log.info("shutting down")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()


def run_server(config: ControllerConfig, ready: Any = None) -> int:
    """Blocking entry point of `taskd server`; returns the exit code. gRPC core's handshake-failure lines
    are rate-limited on their way to stderr while it serves (native_log.py)."""
    native = NativeLogFilter()
    native.install()
    try:
        asyncio.run(serve(config, ready))
    finally:
        native.uninstall()
    return 0


JOB_LINGER = 60.0
"""Seconds node 0's hosted controller waits, after node 0's run ended, for the other nodes to report theirs."""


class EmbeddedController:
    """A controller running on its own event loop in a daemon thread of this process.

    Its caller makes the token for the run (`ControllerConfig(token=secrets.token_urlsafe(32))`) and hands
    it to its own agent in-process: it is never printed, never in argv, never in a rank's environment. With
    `advertise` a locator only this user can read holds, for `taskd status`, a credential that only reads jobs
    (auth.status_credential; controller/locator.py): this user's ranks can read it, and control nothing with it.
    A bad config is refused at construction (`ConfigError`), exactly as `taskd server` refuses it.
    """

    def __init__(self, config: ControllerConfig | None = None, advertise: bool = False) -> None:
        """`advertise`: leave a locator for `taskd status` while it serves (controller/locator.py)."""
        self.config = config or ControllerConfig(listen="127.0.0.1:0", state_path=MEMORY)
        self.advertise = advertise
        self._locator: Path | None = None
        self.server: ControllerServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._address = ""
        # at stop, seconds to keep serving until every job has ended: other nodes' finish reports still come in
        # after this node's run ended (a node 0 that stopped at once left node 1 retrying for 30 s)
        self.linger = 0.0

    @classmethod
    def for_agent(cls, max_restarts: int, node_rejoin_timeout: float | None = None) -> EmbeddedController:
        """The controller `taskd run` and the msrun plugin run when given none: a free loopback port, state in
        memory, and a random token that only the agent in this process learns (`token`; `taskd status` gets a
        read-only credential from the locator). `node_rejoin_timeout`
        (default $TASKD_NODE_REJOIN_TIMEOUT, else 300 s): how long a node-loss round waits for a replacement."""
        rejoin = node_rejoin_timeout
        if rejoin is None:
            rejoin = rejoin_timeout_from_env()
        return cls(ControllerConfig(listen="127.0.0.1:0", state_path=MEMORY, default_max_restarts=max_restarts,
                                    token=secrets.token_urlsafe(32), node_rejoin_timeout=rejoin), advertise=True)

    @classmethod
    def for_job(cls, listen: str, token: str, max_restarts: int, node_rejoin_timeout: float,
                last_call_timeout: float = setting("last_call_timeout").default) -> EmbeddedController:
        """The controller node 0's `taskd run` hosts for a whole multi-node job (torchrun's line without --server):
        on `listen`, where the other nodes connect, with the secret every node read from TASKD_TOKEN_FILE as its
        admin token; state in memory (it lives as long as node 0's run)."""
        hosted = cls(ControllerConfig(listen=listen, state_path=MEMORY, default_max_restarts=max_restarts,
                                      token=token, node_rejoin_timeout=node_rejoin_timeout,
                                      last_call_timeout=last_call_timeout), advertise=True)
        hosted.linger = JOB_LINGER
        return hosted

    @property
    def address(self) -> str:
        return self._address

    @property
    def token(self) -> str | None:
        """What this process's agent sends; other local users who see the port cannot call without it."""
        return self.config.token

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
        if self.linger > 0 and not self._jobs_ended():
            log.info("keeping the job's controller up until every node has reported its end (at most %.0fs)",
                     self.linger)
            deadline = time.monotonic() + self.linger
            while not self._jobs_ended() and time.monotonic() < deadline:
                time.sleep(0.05)
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("embedded controller did not stop within %ss", timeout)
        self._thread = None

    def _jobs_ended(self) -> bool:
        """No job still has an agent online that has not reported its end (one gone or never come is not waited on)."""
        core = self.server.core if self.server is not None else None
        for job in list(core.jobs.values()) if core is not None else ():
            agents = [job.agents.get(n) for n in list(job.agents)]
            if job.state not in TERMINAL and any(a is not None and a.online and not a.finished for a in agents):
                return False
        return True

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
        # where `taskd status` on this host finds this run's jobs (controller/locator.py): with a credential that
        # only reads them, since every process of this user, this run's ranks included, can read the locator
        token = self.config.token
        self._locator = (write_locator(self._address, status_credential(token) if token else None)
                         if self.advertise else None)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            remove_locator(self._locator)
            await server.stop(min(self.config.grace, 1.0))
