"""The token: every RPC of every service checks it; `taskd server` refuses an open address without one."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import secret_file
from support.scripted_agent import CALL_TIMEOUT, ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, taskd_pb2

REPO = Path(__file__).resolve().parents[3]
TOKEN = "tok-" + "0123456789abcdef" * 2

UNARY = ["/Recover/Init", "/Recover/Register", "/Recover/HealthCheck", "/Recover/ReportStopComplete",
         "/Recover/ReportRecoverStrategy", "/Recover/ReportRecoverStatus", "/Recover/ReportProcessFault",
         "/taskd.v1.AgentReport/ReportFinished", "/taskd.v1.JobStatus/ListJobs"]
STREAM = "/Recover/SubscribeProcessManageSignal"
JOB = recover_pb2.ClientInfo(jobId="authjob").SerializeToString()  # decodes as every request type here


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call, as taskd's clients do."""

    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def _with(self, details):  # noqa: ANN001, ANN202
        return details._replace(metadata=[*(details.metadata or ()), self.header])

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._with(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._with(details), request)


def with_token(agent: ScriptedAgent, token: str) -> ScriptedAgent:
    """The ScriptedAgent speaking over a channel that carries the token."""
    from taskd.proto import recover_pb2_grpc, taskd_pb2_grpc

    agent.channel.close()
    agent.channel = grpc.intercept_channel(grpc.insecure_channel(agent.address), _Token(token))
    agent.stub = recover_pb2_grpc.RecoverStub(agent.channel)
    agent.reports = taskd_pb2_grpc.AgentReportStub(agent.channel)
    agent.status_stub = taskd_pb2_grpc.JobStatusStub(agent.channel)
    return agent


@pytest.fixture(scope="module")
def ctl() -> Iterator[str]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.5, token=TOKEN)
    with EmbeddedController(cfg) as c:
        yield c.address


def call_all(address: str, metadata: list[tuple[str, str]] | None) -> dict[str, grpc.StatusCode]:
    """Every method of every service, called with `metadata`: method -> the gRPC code it ended with."""
    codes = {}
    with grpc.insecure_channel(address) as ch:
        for method in UNARY:
            try:
                ch.unary_unary(method)(JOB, timeout=CALL_TIMEOUT, metadata=metadata)
                codes[method] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                codes[method] = exc.code()
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    assert "TASKD_TOKEN_FILE" in exc.details() and TOKEN not in exc.details()
        try:
            next(iter(ch.unary_stream(STREAM)(JOB, timeout=CALL_TIMEOUT, metadata=metadata)))
            codes[STREAM] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            codes[STREAM] = exc.code()
    return codes


@pytest.mark.parametrize("metadata", [
    None,
    [("authorization", "Bearer wrong-token-0123456789abcdef")],
    [("authorization", f"Bearer {TOKEN}x")],
    [("authorization", TOKEN)],
    [("authorization", f"Basic {TOKEN}")],
], ids=["none", "wrong", "longer", "no scheme", "basic"])
def test_every_rpc_of_every_service_refuses_a_missing_or_wrong_token(ctl: str, metadata) -> None:
    codes = call_all(ctl, metadata)
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, codes
    assert len(codes) == len(UNARY) + 1


def test_every_rpc_answers_with_the_token(ctl: str) -> None:
    codes = call_all(ctl, [("authorization", f"Bearer {TOKEN}")])
    assert grpc.StatusCode.UNAUTHENTICATED not in codes.values(), codes
    # Init and Register (called first) made node 0 of the job: its stream opens with a keep-alive
    assert set(codes.values()) == {grpc.StatusCode.OK}, codes


def test_an_agent_with_the_token_runs_a_round(ctl: str) -> None:
    agent = with_token(ScriptedAgent(ctl, "tokjob", 0, 1, ranks_per_node=2), TOKEN).join()
    try:
        assert agent.fault({1: 1}).code == 0
        agent.expect("stopTrain")
        assert agent.list_jobs("tokjob").jobs[0].state == "STOPPING"
    finally:
        agent.close()


def test_the_refusal_is_logged_once_and_never_shows_the_token(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=TOKEN)
    with EmbeddedController(cfg) as c:
        call_all(c.address, [("authorization", "Bearer wrong-token-0123456789abcdef")])
        call_all(c.address, [("authorization", f"Bearer {TOKEN}")])
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    refused = [r for r in caplog.records if r.name == "taskd.controller.service.guard" and "refused" in r.getMessage()]
    assert len(refused) == 1 and "wrong token" in refused[0].getMessage()  # one line for a burst of 10


# ---------------------------------------------------------------------------- taskd server on an open address


def start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """`taskd server ARGS` -> (process, address) once it prints that it listens (30 s at most)."""
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--state", ":memory:", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"taskd server did not start: {line!r} {proc.communicate(timeout=10)}")
    return proc, line.rsplit(" ", 1)[1].strip()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_taskd_server_refuses_an_open_address_without_a_token_and_says_why() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TASKD_TOKEN_FILE"}
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "0.0.0.0:0", "--state", ":memory:"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    for words in ("can be reached from other hosts", "--token-file", "TASKD_TOKEN_FILE", "--insecure"):
        assert words in proc.stderr, proc.stderr


def test_insecure_serves_clusterd_wire_clients_without_a_token() -> None:
    proc, address = start(["--listen", "0.0.0.0:0", "--insecure"])
    try:
        agent = ScriptedAgent(address, "wire", 0, 1).join()  # no metadata at all, as TaskD's recover_manager
        assert agent.health().code == 0
        agent.close()
    finally:
        stop(proc)
    assert "without a token (--insecure)" in proc.stderr.read()


def test_token_file_from_the_environment_guards_the_server_and_taskd_status_sends_it(tmp_path: Path) -> None:
    token_file = secret_file(tmp_path / "token", TOKEN + "\n")
    proc, address = start(["--listen", "0.0.0.0:0"], env={"TASKD_TOKEN_FILE": str(token_file)})
    try:
        bare = ScriptedAgent(address, "envjob", 0, 1)
        with pytest.raises(grpc.RpcError) as err:
            bare.init()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bare.close()
        assert with_token(ScriptedAgent(address, "envjob", 0, 1), TOKEN).init().code == 0
        base = [sys.executable, "-m", "taskd", "status", "--server", address]
        clean = {k: v for k, v in os.environ.items() if k != "TASKD_TOKEN_FILE"}
        refused = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=60, env=clean)
        assert refused.returncode == 1
        assert "answered but refused the query: UNAUTHENTICATED" in refused.stderr, refused.stderr
        assert "not running" not in refused.stderr and "--token-file" in refused.stderr
        listed = subprocess.run([*base, "--token-file", str(token_file), "--json"], cwd=REPO, capture_output=True,
                                text=True, timeout=60, env=clean)
        assert listed.returncode == 0 and '"jobId": "envjob"' in listed.stdout, listed.stderr
    finally:
        stop(proc)


def test_status_reply_types_are_unchanged_for_callers_without_paging(ctl: str) -> None:
    agent = with_token(ScriptedAgent(ctl, "plain", 0, 1), TOKEN)
    try:
        assert agent.init().code == 0
        whole = agent.status_stub.ListJobs(taskd_pb2.JobQuery(), timeout=CALL_TIMEOUT)
        assert whole.status.code == 0 and not whole.nextPageToken and "plain" in [j.jobId for j in whole.jobs]
    finally:
        agent.close()
