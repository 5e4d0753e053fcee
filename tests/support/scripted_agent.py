"""`ScriptedAgent`: a real gRPC client that plays one agent step by step.

It speaks to the controller with the raw generated stubs, so a test can drive every call of a
recovery round and read the signals it gets. A test double, so it lives in tests/support/ (importable as
`support.scripted_agent`) and not in the shipped package; nothing in taskd/ or bench/ uses it.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Mapping, Sequence

import grpc

from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import SignalType

CALL_TIMEOUT = 10.0


def fault_ranks(faults: Mapping[int | str, int | str]) -> list[recover_pb2.FaultRank]:
    return [recover_pb2.FaultRank(rankId=str(r), faultType=str(t)) for r, t in faults.items()]


class StreamEnded(Exception):
    """The signal stream ended; `code` is its gRPC status code."""

    def __init__(self, code: grpc.StatusCode | None, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class _CallDetails(collections.namedtuple("_CallDetails", "method timeout metadata credentials wait_for_ready "
                                                        "compression"), grpc.ClientCallDetails):
    pass


class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(details.method, details.timeout, [*(details.metadata or ()), self.header],
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(client_call_details), request)


def bearer_stubs(address: str, token: str) -> tuple[grpc.Channel, recover_pb2_grpc.RecoverStub,
                                                    taskd_pb2_grpc.AgentReportStub, taskd_pb2_grpc.JobStatusStub]:
    """A channel whose every call carries `token`, and the controller's three stubs on it (the caller closes it)."""
    ch = grpc.intercept_channel(grpc.insecure_channel(address), Bearer(token))
    return ch, recover_pb2_grpc.RecoverStub(ch), taskd_pb2_grpc.AgentReportStub(ch), taskd_pb2_grpc.JobStatusStub(ch)


_R, _T = recover_pb2, taskd_pb2
# Every call a credential can make against job `victim` (its agent v-host:111), each as that agent would; a call
# takes the Recover, AgentReport and JobStatus stubs (credential tests: what another job's credential is refused).
VICTIM_CALLS = {
    "Init": lambda r, a, s: r.Init(_R.ClientInfo(jobId="victim", nodeCount=1, ranksPerNode=1), timeout=CALL_TIMEOUT),
    "Register": lambda r, a, s: r.Register(_R.ClientInfo(jobId="victim", host="v-host", pid=111),
                                           timeout=CALL_TIMEOUT),
    "HealthCheck": lambda r, a, s: r.HealthCheck(_R.ClientInfo(jobId="victim"), timeout=CALL_TIMEOUT),
    "ReportProcessFault": lambda r, a, s: r.ReportProcessFault(
        _R.ProcessFaultRequest(jobId="victim", faultRanks=fault_ranks({0: 1}), host="v-host", pid=111),
        timeout=CALL_TIMEOUT),
    "ReportStopComplete": lambda r, a, s: r.ReportStopComplete(_R.StopCompleteRequest(jobId="victim"),
                                                               timeout=CALL_TIMEOUT),
    "ReportRecoverStrategy": lambda r, a, s: r.ReportRecoverStrategy(
        _R.RecoverStrategyRequest(jobId="victim", strategies=["exit"]), timeout=CALL_TIMEOUT),
    "ReportRecoverStatus": lambda r, a, s: r.ReportRecoverStatus(
        _R.RecoverStatusRequest(jobId="victim", strategy="exit"), timeout=CALL_TIMEOUT),
    "ReportFinished": lambda r, a, s: a.ReportFinished(_T.FinishRequest(jobId="victim", exitCode=1),
                                                       timeout=CALL_TIMEOUT),
    "ListJobs of the victim": lambda r, a, s: s.ListJobs(_T.JobQuery(jobId="victim"), timeout=CALL_TIMEOUT),
    "SubscribeProcessManageSignal": lambda r, a, s: next(iter(r.SubscribeProcessManageSignal(
        _R.ClientInfo(jobId="victim", host="v-host", pid=111), timeout=CALL_TIMEOUT))),
}


class ScriptedAgent:
    def __init__(self, address: str, job_id: str, node_rank: int = 0, node_count: int = 1, ranks_per_node: int = 1,
                 host: str = "localhost", pid: int = 0, role: str = "agent", token: str | None = None) -> None:
        self.address = address
        self.info = recover_pb2.ClientInfo(jobId=job_id, role=role, nodeRank=node_rank, nodeCount=node_count,
                                           ranksPerNode=ranks_per_node, host=host, pid=pid or 10_000 + node_rank)
        self.channel = grpc.insecure_channel(address)
        if token is not None:  # every call and the stream carry it, as the real client's do
            self.channel = grpc.intercept_channel(self.channel, Bearer(token))
        self.stub = recover_pb2_grpc.RecoverStub(self.channel)
        self.reports = taskd_pb2_grpc.AgentReportStub(self.channel)
        self.status_stub = taskd_pb2_grpc.JobStatusStub(self.channel)
        self.signals: queue.Queue[recover_pb2.ProcessManageSignal | StreamEnded] = queue.Queue()
        self._call: grpc.Future | None = None
        self._reader: threading.Thread | None = None

    @property
    def job_id(self) -> str:
        return self.info.jobId

    @property
    def node_rank(self) -> int:
        return self.info.nodeRank

    # ------------------------------------------------------------------ lifecycle

    def init(self, max_restarts: int | None = None, strategies: Sequence[str] = ()) -> recover_pb2.Status:
        info = recover_pb2.ClientInfo()
        info.CopyFrom(self.info)
        if max_restarts is not None:
            info.maxRestarts = max_restarts
        info.strategies[:] = list(strategies)
        return self.stub.Init(info, timeout=CALL_TIMEOUT)

    def register(self) -> recover_pb2.Status:
        return self.stub.Register(self.info, timeout=CALL_TIMEOUT)

    def health(self) -> recover_pb2.Status:
        return self.stub.HealthCheck(self.info, timeout=CALL_TIMEOUT)

    def join(self, **init: object) -> ScriptedAgent:
        """Init, Register and subscribe, asserting each answered 0."""
        for status in (self.init(**init), self.register()):  # type: ignore[arg-type]
            if status.code != 0:
                raise AssertionError(f"node {self.node_rank}: {status.code} {status.info}")
        self.subscribe()
        return self

    def subscribe(self) -> None:
        self.unsubscribe()
        call = self.stub.SubscribeProcessManageSignal(self.info)
        self._call = call
        self._reader = threading.Thread(target=self._read, args=(call,), daemon=True,
                                        name=f"scripted-agent-{self.node_rank}")
        self._reader.start()

    def _read(self, call: grpc.Future) -> None:
        try:
            for msg in call:
                self.signals.put(msg)
            self.signals.put(StreamEnded(grpc.StatusCode.OK, "stream ended"))
        except grpc.RpcError as exc:
            self.signals.put(StreamEnded(exc.code(), exc.details() or ""))

    def unsubscribe(self) -> None:
        if self._call is not None:
            self._call.cancel()
            if self._reader is not None:
                self._reader.join(CALL_TIMEOUT)
            self._call = None
            while not self.signals.empty():
                self.signals.get_nowait()

    def close(self) -> None:
        self.unsubscribe()
        self.channel.close()

    # ------------------------------------------------------------------ signals

    def next_signal(self, timeout: float = 20.0, keepalive: bool = False) -> recover_pb2.ProcessManageSignal:
        """The next signal (keep-alives skipped unless asked for); raises StreamEnded / queue.Empty."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.signals.get(timeout=max(deadline - time.monotonic(), 0.0))
            if isinstance(item, StreamEnded):
                raise item
            if keepalive or item.signalType != SignalType.KEEP_ALIVE:
                return item

    def expect(self, signal_type: str, strategy: str = "", timeout: float = 20.0) -> recover_pb2.ProcessManageSignal:
        sig = self.next_signal(timeout)
        if sig.signalType != signal_type or (strategy and sig.changeStrategy != strategy):
            raise AssertionError(f"node {self.node_rank} expected {signal_type} {strategy}, got "
                                 f"{sig.signalType} {sig.changeStrategy}")
        return sig

    def no_signal(self, wait: float = 0.3) -> None:
        """Assert nothing but keep-alives arrives within `wait` seconds."""
        try:
            sig = self.next_signal(wait)
        except queue.Empty:
            return
        raise AssertionError(f"node {self.node_rank} got unexpected {sig.signalType} {sig.changeStrategy}")

    # ------------------------------------------------------------------ reports

    def _who(self) -> dict[str, object]:
        """The agent process a report comes from (a fenced one is refused 411)."""
        return {"host": self.info.host, "pid": self.info.pid}

    def fault(self, faults: Mapping[int | str, int | str], detail: str = "") -> recover_pb2.Status:
        req = recover_pb2.ProcessFaultRequest(jobId=self.job_id, faultRanks=fault_ranks(faults),
                                              nodeRank=self.node_rank, detail=detail, **self._who())
        return self.stub.ReportProcessFault(req, timeout=CALL_TIMEOUT)

    def stop_complete(self, code: int = 0, info: str = "", faults: Mapping[int | str, int | str] | None = None
                      ) -> recover_pb2.Status:
        req = recover_pb2.StopCompleteRequest(jobId=self.job_id, status=recover_pb2.Status(code=code, info=info),
                                              faultRanks=fault_ranks(faults or {}), nodeRank=self.node_rank,
                                              **self._who())
        return self.stub.ReportStopComplete(req, timeout=CALL_TIMEOUT)

    def strategies(self, names: Sequence[str], faults: Mapping[int | str, int | str] | None = None
                   ) -> recover_pb2.Status:
        req = recover_pb2.RecoverStrategyRequest(jobId=self.job_id, faultRanks=fault_ranks(faults or {}),
                                                 strategies=list(names), nodeRank=self.node_rank, **self._who())
        return self.stub.ReportRecoverStrategy(req, timeout=CALL_TIMEOUT)

    def status(self, strategy: str, code: int = 0, info: str = "", rejoined: bool = False) -> recover_pb2.Status:
        req = recover_pb2.RecoverStatusRequest(jobId=self.job_id, status=recover_pb2.Status(code=code, info=info),
                                               strategy=strategy, nodeRank=self.node_rank, rejoined=rejoined,
                                               **self._who())
        return self.stub.ReportRecoverStatus(req, timeout=CALL_TIMEOUT)

    def finished(self, exit_code: int = 0, message: str = "") -> recover_pb2.Status:
        req = taskd_pb2.FinishRequest(jobId=self.job_id, nodeRank=self.node_rank, exitCode=exit_code, message=message,
                                      **self._who())
        return self.reports.ReportFinished(req, timeout=CALL_TIMEOUT)

    def pace(self, paces: Mapping[int, float], factor: float = 1.5, steps: int = 10) -> taskd_pb2.PaceReply:
        """taskd.v1 ReportPace: {global rank: compute seconds per step} of this node's ranks."""
        req = taskd_pb2.PaceRequest(jobId=self.job_id, nodeRank=self.node_rank, factor=factor, ranks=[
            taskd_pb2.RankPace(rank=r, computeSeconds=s, steps=steps) for r, s in paces.items()], **self._who())
        return self.reports.ReportPace(req, timeout=CALL_TIMEOUT)

    def list_jobs(self, job_id: str = "") -> taskd_pb2.JobList:
        return self.status_stub.ListJobs(taskd_pb2.JobQuery(jobId=job_id), timeout=CALL_TIMEOUT)
