"""The agent's link to the controller: connect and register, turn its signals into commands, report back.

The controller is either remote (`config.server`) or one the caller hands in (`LocalController`,
e.g. taskd's embedded controller): the agent never builds one itself, so it does not depend on the
controller package. Signals arrive on the subscriber thread; they are only queued here, and the
agent's own thread carries them out (see supervisor.py).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from taskd.agent.config import AgentConfig
from taskd.agent.link.orders import WIRE_COMMANDS, Command, Order
from taskd.agent.link.registration import ContinueWord, Fencing, register_held
from taskd.agent.link.reports import Reporter
from taskd.agent.ranks.table import RankLayout
from taskd.agent.round.states import LossTimer
from taskd.client import ClientCredentials, ConfigurationError, RecoverClient
from taskd.client.current import set_manager
from taskd.client.errors import AuthenticationError, FencedError, RecoverClientError
from taskd.client.rpc import make_channel
from taskd.process.conceal import conceal
from taskd.proto import recover_pb2, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code, SignalType
from taskd.worker.env import is_credential_var

log = logging.getLogger("taskd.agent")


class JobStatusUnsupported(RuntimeError):
    """The controller serves only ClusterD's Recover service (no taskd.v1.JobStatus to ask who joined)."""


class LocalController(Protocol):
    """A controller the caller runs for this agent alone (taskd's EmbeddedController): started, then stopped."""

    def start(self) -> str: ...  # returns the address to connect to

    def stop(self) -> None: ...

    @property
    def token(self) -> str | None: ...  # handed to this agent in-process only


def forget_credential_vars(environ: MutableMapping[str, str]) -> list[str]:
    """Drop TASKD_TOKEN_FILE, TASKD_TLS_* from `environ` once the agent holds what they name (issue 19)."""
    names = [name for name in environ if is_credential_var(name)]
    for name in names:
        del environ[name]
    if names:
        log.debug("credentials read; %s removed from the environment the ranks inherit", ", ".join(sorted(names)))
    return names


def lost_ago(record: taskd_pb2.JobRecord, node_rank: int, now: float) -> float | None:
    """Seconds since `node_rank`'s fault, by its newest node-loss record (wall clocks of the controller's host and
    this one): its declaration, plus how long its agent had been without a stream then (the newest `node_lost`
    event's `seconds`); None if it never was lost. A replacement's recovery is timed from the fault, as the
    survivors' is (their stopTrain's "fault_ago"), not from the declaration a grace later (issue 32, F6)."""
    lost = [x.lostAt for r in record.rounds for x in r.nodeLosses if x.nodeRank == node_rank and x.lostAt > 0]
    if not lost:
        return None
    unseen = 0.0
    for event in record.events:
        if event.kind == "node_lost":
            try:
                detail = json.loads(event.detail or "{}")
                if int(detail["node_rank"]) == node_rank:
                    unseen = min(max(float(detail["seconds"]), 0.0), 86400.0)
            except (ValueError, KeyError, TypeError):
                continue
    return max(0.0, now - max(lost)) + unseen


class ControllerLink:
    """One agent's connection to its job's controller; `connect()` False means degraded (no controller)."""

    def __init__(self, config: AgentConfig, wake: Callable[[], None], local: LocalController | None = None,
                 credentials: ClientCredentials | None = None) -> None:
        self.config = config
        self._wake = wake
        self._local = local
        self._credentials = credentials  # for config.server; None: TASKD_TOKEN_FILE / TASKD_TLS_* (the client reads)
        self._local_started = False
        self._mgr: RecoverClient | None = None
        self._subscriber: threading.Thread | None = None
        self._orders: queue.Queue[Order] = queue.Queue()
        self._seen: set[tuple[Command, str]] = set()
        self._status_channel: Any = None
        self.loss = LossTimer(config.controller_timeout)
        self._closed = False  # after close(), a late RPC completion must not wake a loop (its fd) that is gone

        def wake_unless_closed() -> None:
            if not self._closed:
                self._wake()

        def fence_order(reason: str) -> None:  # one FENCE order, queued like the controller's (registration.py)
            self._orders.put(Order(Command.FENCE, "", SignalType.FENCED, (), {}, "", 0.0, reason))
            wake_unless_closed()

        self.fencing = Fencing(fence_order)
        # ranks continued after a stop wait for this agent's word, asked of the controller (issue 31)
        self.continued = ContinueWord(lambda: self._mgr, self.fencing.fence)
        self.rejoining_at_register: frozenset[int] | None = None  # JobRecord.rejoining as this agent registered
        self.lost_ago: float | None = None  # seconds since the controller declared this node lost (a replacement)
        # every report to the controller, past the same checks, through one outbox (agent/link/reports.py)
        self.reports = Reporter(lambda: self._mgr, self.fencing, config.controller_timeout, wake_unless_closed)
        self.refusal: str | None = None  # why connect() failed: the controller's refusal, "" when none answered
        self.taken_by: str | None = None  # refused: the replacement (host:pid) holding this node (registration.py)

    @property
    def active(self) -> bool:
        """Registered with a controller (it may be unreachable for now)."""
        return self._mgr is not None

    @property
    def connected(self) -> bool:
        return self._mgr is not None and self._mgr.connected

    def connect(self, job_id: str, layout: RankLayout, as_standby: bool = False) -> bool:
        """Init, register and subscribe; False when no controller takes this agent (run degraded).

        An `as_standby` agent joins as a spare: the controller ignores its node rank until it assigns it one."""
        cfg = self.config
        address = cfg.server
        if address is None:
            if self._local is None:
                raise ConfigurationError("no controller: set MINDX_SERVER_IP (or --server), or hand the agent "
                                         "an embedded controller")
            address = self._local.start()
            self._local_started = True
            log.debug("embedded controller on %s", address)
        info = recover_pb2.ClientInfo(
            jobId=job_id, role="agent", nodeRank=layout.node_rank, nodeCount=layout.node_count,
            ranksPerNode=layout.ranks_per_node, maxRestarts=cfg.max_restarts, host=socket.gethostname(),
            pid=os.getpid(), strategies=cfg.offered_strategies, standby=as_standby, minNodes=cfg.min_nodes)
        # An embedded controller lives and dies with this process: 3 s keepalive pings (for a remote
        # controller's death) only cost an idle agent CPU there.
        options = (("grpc.keepalive_time_ms", 60_000),) if self._local_started else ()
        # The embedded controller's token reaches its agent here, in-process: never argv, env or console.
        if self._local_started:
            credentials: ClientCredentials | None = ClientCredentials(token=self._local.token)
        else:
            credentials = self._credentials if self._credentials is not None else ClientCredentials.from_env()
            if cfg.launcher == "msrun":  # msrun's ranks inherit this process's environment: read, then forget
                forget_credential_vars(os.environ)
        if cfg.launcher == "msrun":  # msrun's ranks are its children: no credential's path, variable or memory
            conceal((), (), is_credential_var)  # in their reach (process/conceal.py; `taskd run` conceals at start)
        mgr = RecoverClient(info, address, init_timeout=max(1.0, cfg.controller_timeout),
                            channel_options=options, credentials=credentials)
        self.refusal = self._register(mgr, info, address)
        if self.refusal is not None:
            mgr.stop()
            return False
        self._mgr = mgr
        set_manager(mgr)  # TaskD's module functions, called in this process, use it
        for name, command in WIRE_COMMANDS.items():
            mgr.register_action_handler(name, self._queue(command))
        # right after Register, before the stream opens: once this agent subscribes the controller may act on it
        # (a node-loss round's strategy), and stop listing the node as one it waits for (agent/link/node_loss.py)
        self.rejoining_at_register = self.rejoining() if layout.node_count > 1 else frozenset()
        frame = "mindspore" if cfg.launcher == "msrun" else "pytorch"  # TaskD's default otherwise
        self._subscriber = threading.Thread(target=mgr.start_subscribe, args=(frame,), name="taskd-subscriber",
                                            daemon=True)
        self._subscriber.start()
        deadline = time.monotonic() + 5.0
        while not mgr.connected and time.monotonic() < deadline:  # set-up only: ranks are not started yet
            time.sleep(0.01)
        node = "a standby" if as_standby else f"node {layout.node_rank}"
        log.info("job %s: %s of %d, %d rank(s), controller %s%s", job_id, node, layout.node_count,
                 layout.ranks_per_node, address, " (embedded)" if self._local_started else "")
        return True

    def register_as(self, layout: RankLayout) -> bool:
        """A standby the controller assigned a node: Register again as that node (same host and pid), and keep
        that identity for every later report and resubscription."""
        mgr = self._mgr
        if mgr is None:
            return False
        info = recover_pb2.ClientInfo()
        info.CopyFrom(mgr.info)
        info.nodeRank, info.standby, info.ranksPerNode = layout.node_rank, False, layout.ranks_per_node
        try:
            reg = register_held(lambda: mgr.register(info, adopt=True), lambda: self.record_of(mgr),
                                layout.node_rank, 0.0)  # refused: the client keeps its standby identity
        except FencedError as exc:
            self.fencing.fence(str(exc))
            return False
        except RecoverClientError as exc:
            log.error("could not register as node %d: %s", layout.node_rank, exc)
            return False
        status, self.taken_by = reg.status, reg.taken_by
        if status.code == Code.FENCED:
            self.fencing.fence(status.info)
        elif status.code != Code.OK and reg.taken_by is None:
            log.error("the controller refused this standby as node %d: %d %s", layout.node_rank, status.code,
                      status.info)
        return status.code == Code.OK

    def hand_over(self, on: bool) -> None:
        """This node moves to another agent (a node migration's "go" here), or not any more (called off): while on,
        a re-Register refused because the successor holds the node ends the signal stream quietly (no 409 warning,
        no reconnecting: client/manager.py, `handing_over`)."""
        if self._mgr is not None:
            self._mgr.handing_over = on

    def probe_fenced(self, now: float) -> None:
        """Cut off from the controller: ask, in the background, whether this agent was fenced (registration.py)."""
        last = self._mgr.last_signal_time if self._mgr is not None else None
        self.fencing.probe(self._mgr, self.connected, now, time.time() - last if last else 0.0)

    def _register(self, mgr: RecoverClient, info: recover_pb2.ClientInfo, address: str) -> str | None:
        """None once registered; else why not: the controller's refusal, or "" when none answered. A node rank
        another agent holds is asked for again while its holder's loss may be pending (registration.py)."""
        try:
            if not mgr.init_clusterd():
                return mgr.init_refusal  # "" when none answered, or recovery is disabled
            reg = register_held(lambda: mgr.register(info), lambda: self.record_of(mgr), info.nodeRank,
                                2 * self.config.controller_timeout)
            status, self.taken_by = reg.status, reg.taken_by
            if status.code != Code.OK:
                if reg.taken_by is None:
                    log.warning("controller %s refused registration: %d %s", address, status.code, status.info)
                return f"{status.code} {status.info}"
            return None
        except AuthenticationError as exc:  # retrying cannot help: the user must fix the token
            raise ConfigurationError(str(exc)) from None
        except ConfigurationError:
            raise
        except RecoverClientError as exc:  # unreachable, or a controller-side error (e.g. its store failed)
            log.warning("%s: running degraded (local restarts only)", exc)
            return ""

    def _queue(self, command: Command) -> Callable[[Any], None]:
        def handler(sig: Any) -> None:
            # a resubscribing agent is sent the signal it still owes an answer to again, same uuid
            key = (command, sig.uuid)
            if sig.uuid and key in self._seen:
                log.debug("signal %s already handled", sig.uuid)
                return
            self._seen.add(key)
            self._orders.put(Order.of(command, sig))
            self._wake()
        return handler

    def next_order(self) -> Order | None:
        try:
            return self._orders.get_nowait()
        except queue.Empty:
            return None

    def lost_during_round(self, now: float, round_open: bool) -> float | None:
        """Seconds the controller has been gone while a round waits on it, once that reaches the timeout."""
        return self.loss.expired(now, self.active and round_open and not self.connected)

    @property
    def job_id(self) -> str:
        return self._mgr.info.jobId if self._mgr is not None else ""

    def _job_record(self, timeout: float, mgr: RecoverClient | None = None) -> taskd_pb2.JobRecord | str | None:
        """This job's record (taskd.v1 JobStatus); the controller's info when it no longer knows the job;
        None when it did not answer. Raises `JobStatusUnsupported` when it does not offer JobStatus."""
        mgr = mgr or self._mgr
        if mgr is None:
            return None
        if self._status_channel is None:
            self._status_channel = make_channel(mgr.server_addr, (), mgr.credentials)
        stub = taskd_pb2_grpc.JobStatusStub(self._status_channel)
        try:
            answer = stub.ListJobs(taskd_pb2.JobQuery(jobId=mgr.info.jobId), timeout=timeout,
                                   metadata=mgr.credentials.metadata())
        except Exception as exc:  # grpc.RpcError: unreachable, refused; the caller asks again or gives up
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if getattr(code, "name", "") == "UNIMPLEMENTED":  # e.g. ClusterD: only the Recover service
                why = f"the controller at {mgr.server_addr} does not offer taskd.v1.JobStatus"
                raise JobStatusUnsupported(why) from None
            log.debug("job status of %s: %s", mgr.info.jobId, exc)
            return None
        if answer.status.code != Code.OK or not answer.jobs:
            return answer.status.info
        return answer.jobs[0]

    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None:
        """(state, info) of this job on the controller (taskd.v1 JobStatus); ("", info) when the controller
        no longer knows the job; None when it did not answer (or offers no JobStatus)."""
        try:
            record = self._job_record(timeout)
        except JobStatusUnsupported as exc:
            log.debug("%s", exc)
            return None
        if record is None or isinstance(record, str):
            return None if record is None else ("", record)
        return record.state, record.info

    def rejoining(self, timeout: float = 2.0) -> frozenset[int] | None:
        """The node ranks an open node-loss round of this job waits for a replacement of (JobRecord.rejoining), or
        a scaled-in job runs without (JobRecord.absent); None when the controller did not answer or cannot say."""
        record = self.record_of(self._mgr, timeout)
        if record is None:
            return None
        self.lost_ago = lost_ago(record, self._mgr.info.nodeRank if self._mgr is not None else -1, time.time())
        return frozenset(record.rejoining) | frozenset(record.absent)  # absent: a downgrade's, the job grows back

    def absent(self, timeout: float = 2.0) -> frozenset[int] | None:
        """The nodes the job runs without now (JobRecord.absent: a MIN:MAX start's or a scale-in's); None when the
        controller did not answer or cannot say."""
        record = self.record_of(self._mgr, timeout)
        return None if record is None else frozenset(record.absent)

    def job_nodes(self, timeout: float = 2.0) -> tuple[str, str, frozenset[int], frozenset[int]] | None:
        """(state, info, node ranks registered: standbys hold none, node ranks absent: JobRecord.absent) of this job
        on the controller; state "" when it
        no longer knows the job; None when it did not answer. Raises `JobStatusUnsupported` (see `_job_record`)."""
        record = self._job_record(timeout)
        if record is None or isinstance(record, str):
            return None if record is None else ("", record, frozenset(), frozenset())
        return (record.state, record.info, frozenset(a.nodeRank for a in record.agents if not a.standby),
                frozenset(record.absent))

    def close(self, exit_code: int, reason: str) -> None:
        """Tell the controller the job ended here (unless done), stop listening, stop the embedded controller."""
        self._closed = True  # the loop is over: its last reports are flushed by polling, not by wake-ups
        if self._mgr is not None:
            self.reports.finished(exit_code, reason)
            self.reports.wait_finished()  # still pending: wait, to its deadline
            self._mgr.stop()
        if self._status_channel is not None:
            self._status_channel.close()
            self._status_channel = None
        if self._subscriber is not None:
            self._subscriber.join(timeout=5.0)
        if self._local is not None and self._local_started:
            self._local.stop()

    @property
    def client(self) -> RecoverClient | None:
        """The client registered with the controller; None without one (standalone, degraded before a connect)."""
        return self._mgr

    def record_of(self, mgr: RecoverClient | None, timeout: float = 2.0) -> taskd_pb2.JobRecord | None:
        """The job's record; None when there is none to read (no answer, unknown job, no JobStatus offered)."""
        try:
            record = self._job_record(timeout, mgr)
        except JobStatusUnsupported:
            return None
        return None if isinstance(record, str) else record

    def report_snapshots(self, fields: dict[str, Any], timeout: float) -> tuple[taskd_pb2.SnapshotReply | None, str]:
        """One snapshot report (agent/snapshots/replication.py) from this agent's registered identity, and the
        controller's address: (None, "") with no controller to take it or no answer."""
        mgr = self._mgr
        if mgr is None or self.fencing.fenced is not None or mgr.info.standby:
            return None, ""
        try:
            request = taskd_pb2.SnapshotReport(**fields, **mgr.identity())
            return mgr.rpc.call("ReportSnapshots", request, timeout=timeout, service="agent"), mgr.rpc.target
        except (RecoverClientError, ValueError) as exc:
            log.debug("snapshot report not sent: %s", exc)
            return None, ""
