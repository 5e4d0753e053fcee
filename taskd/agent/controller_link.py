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
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from taskd.agent.config import AgentConfig
from taskd.agent.policy import LossTimer
from taskd.agent.ranks import RankLayout
from taskd.client import ClientCredentials, ConfigurationError, RecoverClient
from taskd.client.current import set_manager
from taskd.client.errors import AuthenticationError, RecoverClientError
from taskd.client.rpc import make_channel
from taskd.proto import recover_pb2, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Action, Code, FaultRanks, SignalType, fault_ranks
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


class Command(str, Enum):
    """What the controller asks of this agent, whatever signal or action carried it."""

    STOP = "stop"  # stop the fault ranks, report stop complete
    STRATEGIES = "strategies"  # report the strategies this agent offers
    CHANGE = "change"  # carry out the chosen strategy
    DUMP = "dump"  # healthy ranks save, then the job ends
    KILL = "kill"  # the job ends now


# The wire's actions and signal types -> commands (the client dispatches on these names).
WIRE_COMMANDS = {
    Action.STOP_TRAIN: Command.STOP, Action.ON_GLOBAL_RANK: Command.STRATEGIES,
    Action.CHANGE_STRATEGY: Command.CHANGE, Action.SAVE_AND_EXIT: Command.DUMP,
    Action.FAULT_NODES_EXIT: Command.KILL, SignalType.KILL_MASTER: Command.KILL,
}


@dataclass(frozen=True)
class Order:
    """One command from the controller, as the agent's handlers read it."""

    command: Command
    uuid: str
    signal_type: str
    actions: tuple[str, ...]
    fault_ranks: FaultRanks
    strategy: str
    timeout: float
    extra_params: str

    @classmethod
    def of(cls, command: Command, sig: Any) -> Order:
        raw = dict(sig.fault_ranks or {})
        try:
            faults = fault_ranks(raw)
        except ValueError as exc:  # a fault type taskd does not know: keep it as the controller sent it
            log.debug("signal %s: %s", sig.uuid, exc)
            faults = {int(r): str(t) for r, t in raw.items()}
        return cls(command, sig.uuid, sig.signal_type, tuple(sig.actions), faults, sig.strategy,
                   float(sig.timeout or 0), sig.extra_params)

    def reason(self) -> str:
        """taskd's controller says why it ends a job in extraParams {"reason": ...}; ClusterD sends other JSON."""
        try:
            params = json.loads(self.extra_params or "{}")
        except (TypeError, ValueError):
            return ""
        return str(params.get("reason", "")) if isinstance(params, dict) else ""


def forget_credential_vars(environ: MutableMapping[str, str]) -> list[str]:
    """Drop TASKD_TOKEN_FILE, TASKD_TLS_* from `environ` once the agent holds what they name (issue 19)."""
    names = [name for name in environ if is_credential_var(name)]
    for name in names:
        del environ[name]
    if names:
        log.debug("credentials read; %s removed from the environment the ranks inherit", ", ".join(sorted(names)))
    return names


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
        self._finished_reported = False
        self._status_channel: Any = None
        self.loss = LossTimer(config.controller_timeout)

    @property
    def active(self) -> bool:
        """Registered with a controller (it may be unreachable for now)."""
        return self._mgr is not None

    @property
    def connected(self) -> bool:
        return self._mgr is not None and self._mgr.connected

    def connect(self, job_id: str, layout: RankLayout) -> bool:
        """Init, register and subscribe; False when no controller takes this agent (run degraded)."""
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
            pid=os.getpid(), strategies=cfg.offered_strategies)
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
        mgr = RecoverClient(info, address, init_timeout=max(1.0, cfg.controller_timeout),
                            channel_options=options, credentials=credentials)
        if not self._register(mgr, info, address):
            mgr.stop()
            return False
        self._mgr = mgr
        set_manager(mgr)  # TaskD's module functions, called in this process, use it
        for name, command in WIRE_COMMANDS.items():
            mgr.register_action_handler(name, self._queue(command))
        frame = "mindspore" if cfg.launcher == "msrun" else "pytorch"  # TaskD's default otherwise
        self._subscriber = threading.Thread(target=mgr.start_subscribe, args=(frame,), name="taskd-subscriber",
                                            daemon=True)
        self._subscriber.start()
        deadline = time.monotonic() + 5.0
        while not mgr.connected and time.monotonic() < deadline:  # set-up only: ranks are not started yet
            time.sleep(0.01)
        log.info("job %s: node %d of %d, %d rank(s), controller %s%s", job_id, layout.node_rank,
                 layout.node_count, layout.ranks_per_node, address, " (embedded)" if self._local_started else "")
        return True

    @staticmethod
    def _register(mgr: RecoverClient, info: recover_pb2.ClientInfo, address: str) -> bool:
        try:
            if not mgr.init_clusterd():
                return False
            status = mgr.register(info)
            if status.code != Code.OK:
                log.warning("controller %s refused registration: %d %s", address, status.code, status.info)
            return status.code == Code.OK
        except AuthenticationError as exc:  # retrying cannot help: the user must fix the token
            raise ConfigurationError(str(exc)) from None
        except ConfigurationError:
            raise
        except RecoverClientError as exc:  # unreachable, or a controller-side error (e.g. its store failed)
            log.warning("%s: running degraded (local restarts only)", exc)
            return False

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

    # -- reports (each a no-op without a controller) ---------------------------------------------
    def report_fault(self, faults: FaultRanks, detail: str) -> bool:
        """One attempt: True when the controller took the report (the caller retries on its own timer)."""
        if self._mgr is None:
            return False
        try:
            code = self._mgr.report_process_fault(faults, detail=detail)
            if code == Code.OK:
                return True
            log.warning("controller answered %d to the fault report", code)
        except RecoverClientError as exc:  # unreachable or failing inside: retried, then degraded; never fatal
            log.warning("fault report not taken: %s", exc)
        return False

    def _send(self, what: str, call: Callable[[], int]) -> None:
        """A report the controller answers within a round: its failure is logged; the round's own timers
        (the controller's deadlines, the agent's loss timer) decide what happens next, never a crash."""
        if self._mgr is None:
            return
        try:
            code = call()
            if code != Code.OK:
                log.warning("controller answered %d to %s", code, what)
        except RecoverClientError as exc:
            log.warning("%s not taken: %s", what, exc)

    def report_stop_complete(self, faults: FaultRanks) -> None:
        self._send("stop complete", lambda: self._mgr.report_stop_complete(Code.OK, "", faults))

    def report_strategies(self, faults: FaultRanks, strategies: list[str] | None = None) -> None:
        """What this node offers for the round (default: the configured strategies)."""
        offered = list(self.config.offered_strategies if strategies is None else strategies)
        self._send("strategies", lambda: self._mgr.report_recover_strategy(faults, offered))

    def report_status(self, code: int, msg: str, faults: FaultRanks, strategy: str) -> None:
        self._send("recover status", lambda: self._mgr.report_recover_status(code, msg, faults, strategy))

    def report_finished(self, exit_code: int, reason: str) -> None:
        """Tell the controller every local rank ended (once; the job is over here either way)."""
        if self._mgr is None or self._finished_reported:
            return
        self._finished_reported = True
        try:
            self._mgr.report_finished(exit_code, reason, timeout=None if self._mgr.connected else 3.0)
        except Exception as exc:
            log.debug("could not report the end of the job: %s", exc)

    @property
    def job_id(self) -> str:
        return self._mgr.info.jobId if self._mgr is not None else ""

    def _job_record(self, timeout: float) -> taskd_pb2.JobRecord | str | None:
        """This job's record (taskd.v1 JobStatus); the controller's info when it no longer knows the job;
        None when it did not answer. Raises `JobStatusUnsupported` when it does not offer JobStatus."""
        mgr = self._mgr
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

    def job_nodes(self, timeout: float = 2.0) -> tuple[str, str, frozenset[int]] | None:
        """(state, info, node ranks registered) of this job on the controller; state "" when it no longer
        knows the job; None when it did not answer. Raises `JobStatusUnsupported` (see `_job_record`)."""
        record = self._job_record(timeout)
        if record is None or isinstance(record, str):
            return None if record is None else ("", record, frozenset())
        return record.state, record.info, frozenset(a.nodeRank for a in record.agents)

    def close(self, exit_code: int, reason: str) -> None:
        """Tell the controller the job ended here (unless done), stop listening, stop the embedded controller."""
        if self._mgr is not None:
            self.report_finished(exit_code, reason)
            self._mgr.stop()
        if self._status_channel is not None:
            self._status_channel.close()
            self._status_channel = None
        if self._subscriber is not None:
            self._subscriber.join(timeout=5.0)
        if self._local is not None and self._local_started:
            self._local.stop()
