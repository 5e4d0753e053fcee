"""The client's test servers and fixtures, shared by its unit and e2e tests: `TinyServer`, a real grpc.server
on loopback whose answers a test scripts (`Recorder`), and a clean slate for the process-wide manager."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from taskd.client import ClientCredentials, RecoverClient
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2_grpc
from taskd.python.toolkit.recover_module import recover_manager as api

JOB = "job-1"
TOKEN = "s3cret-token_0123456789"
WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine


class Recorder(recover_pb2_grpc.RecoverServicer, taskd_pb2_grpc.AgentReportServicer):
    """Records every call; answers scripted codes (default 0); streams pushed signals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, object]] = []
        self.stamps: list[tuple[str, float]] = []  # (method, time.monotonic() on arrival)
        self.codes: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
        self.streams: list[queue.Queue] = []
        self.subscriptions = 0
        self.greet = True  # send a keep-alive as soon as a stream opens

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _ in self.calls]

    def requests(self, name: str) -> list:
        with self.lock:
            return [req for n, req in self.calls if n == name]

    def arrivals(self, name: str) -> list[float]:
        with self.lock:
            return [when for n, when in self.stamps if n == name]

    def _answer(self, name: str, request: object) -> recover_pb2.Status:
        with self.lock:
            self.stamps.append((name, time.monotonic()))
            self.calls.append((name, request))
            code = self.codes[name].popleft() if self.codes[name] else 0
        return recover_pb2.Status(code=code, info=f"{name} scripted {code}")

    def Init(self, request, context):
        return self._answer("Init", request)

    def Register(self, request, context):
        return self._answer("Register", request)

    def HealthCheck(self, request, context):
        return self._answer("HealthCheck", request)

    def ReportStopComplete(self, request, context):
        return self._answer("ReportStopComplete", request)

    def ReportRecoverStrategy(self, request, context):
        return self._answer("ReportRecoverStrategy", request)

    def ReportRecoverStatus(self, request, context):
        return self._answer("ReportRecoverStatus", request)

    def ReportProcessFault(self, request, context):
        return self._answer("ReportProcessFault", request)

    def ReportFinished(self, request, context):
        return self._answer("ReportFinished", request)

    def SubscribeProcessManageSignal(self, request, context):
        stream: queue.Queue = queue.Queue()
        with self.lock:
            self.calls.append(("Subscribe", request))
            self.streams.append(stream)
            self.subscriptions += 1
        if self.greet:
            yield recover_pb2.ProcessManageSignal(uuid="hello", jobId=request.jobId, signalType="keep-alive")
        while context.is_active():
            try:
                item = stream.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            yield item

    def push(self, **fields: object) -> None:
        """Send one signal to every open stream."""
        fields.setdefault("jobId", JOB)
        message = recover_pb2.ProcessManageSignal(**fields)
        with self.lock:
            for stream in self.streams:
                stream.put(message)

    def end_streams(self) -> None:
        with self.lock:
            for stream in self.streams:
                stream.put(None)
            self.streams.clear()


class TinyServer:
    """A real grpc.server on 127.0.0.1; restartable on the same port."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.recorder = recorder or Recorder()
        self.port = 0
        self.server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TinyServer:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16),
            options=[
                ("grpc.http2.min_ping_interval_without_data_ms", 1000),
                ("grpc.http2.max_ping_strikes", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        recover_pb2_grpc.add_RecoverServicer_to_server(self.recorder, server)
        taskd_pb2_grpc.add_AgentReportServicer_to_server(self.recorder, server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        assert port, f"could not bind 127.0.0.1:{self.port}"
        self.port = port
        server.start()
        self.server = server
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.recorder.end_streams()
            self.server.stop(grace=0).wait(WAIT)
            self.server = None


def client(address: str, credentials: ClientCredentials, **kwargs) -> RecoverClient:
    kwargs.setdefault("call_timeout", 5.0)
    kwargs.setdefault("backoff_initial", 0.05)
    kwargs.setdefault("backoff_max", 0.3)
    info = recover_pb2.ClientInfo(jobId=JOB, role="agent", nodeRank=0, nodeCount=1)
    return RecoverClient(info, address, credentials=credentials, **kwargs)


@pytest.fixture(autouse=True)
def fresh_instance(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TaskD-API variable set and no manager made: each test builds its own, as a fresh process would."""
    for var in ("MINDX_TASK_ID", "MINDX_SERVER_IP", "TASKD_TOKEN_FILE", "TASKD_TLS_CA", "TASKD_TLS_CERT",
                "TASKD_TLS_KEY", "LOCAL_PROXY_ENABLE"):
        monkeypatch.delenv(var, raising=False)
    api.set_manager(None)
    api.DLRecoverManager.reset_instance()
    yield
    api.set_manager(None)
    api.DLRecoverManager.reset_instance()
