"""Property-based fuzzing of every RPC's fields against a real controller on loopback.

Three properties: every call is answered with a code (never UNKNOWN: no handler raised, nor a
deadline: nothing hung); a refused call changes nothing (ListJobs before == after); and the server
keeps serving a legitimate job, which recovers from a real fault once the fuzzing is over.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scripted_agent import ScriptedAgent, StreamEnded

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Strategy

R, T = recover_pb2, taskd_pb2
TIMEOUT = 10.0
LEGIT = "legit"
INT32 = st.one_of(st.integers(-2, 4), st.integers(-(2**31), 2**31 - 1))
TEXT = st.text(max_size=80)
JOB_IDS = st.one_of(st.sampled_from(["fz-a", "fz-b", "", "x" * 257]), st.text(max_size=300)).filter(
    lambda s: s != LEGIT)
RANK_IDS = st.one_of(st.integers(-3, 8).map(str), st.integers(0, 2**70).map(str), st.text(max_size=12),
                     st.just("9" * 5000))
FAULTS = st.lists(st.builds(R.FaultRank, rankId=RANK_IDS, faultType=st.one_of(st.sampled_from("0123"), TEXT)),
                  max_size=6)
STRATEGIES = st.lists(st.one_of(st.sampled_from(Strategy.ORDER), TEXT), max_size=6)
STATUS = st.builds(R.Status, code=INT32, info=st.text(max_size=200))

CLIENT_INFO = st.builds(
    lambda **kw: R.ClientInfo(**{k: v for k, v in kw.items() if v is not None}),
    jobId=JOB_IDS, role=TEXT, nodeRank=INT32, nodeCount=INT32, ranksPerNode=INT32,
    maxRestarts=st.one_of(st.none(), INT32), host=TEXT, pid=INT32, strategies=STRATEGIES)
CALLS = st.one_of(
    st.tuples(st.sampled_from(["Init", "Register", "HealthCheck", "SubscribeProcessManageSignal"]), CLIENT_INFO),
    st.tuples(st.just("ReportStopComplete"), st.builds(R.StopCompleteRequest, jobId=JOB_IDS, status=STATUS,
                                                       faultRanks=FAULTS, nodeRank=INT32)),
    st.tuples(st.just("ReportRecoverStrategy"), st.builds(R.RecoverStrategyRequest, jobId=JOB_IDS, faultRanks=FAULTS,
                                                          strategies=STRATEGIES, nodeRank=INT32)),
    st.tuples(st.just("ReportRecoverStatus"), st.builds(
        R.RecoverStatusRequest, jobId=JOB_IDS, status=STATUS, strategy=st.one_of(st.sampled_from(Strategy.ORDER), TEXT),
        isolateRankIds=st.lists(RANK_IDS, max_size=4), nodeRank=INT32)),
    st.tuples(st.just("ReportProcessFault"), st.builds(R.ProcessFaultRequest, jobId=JOB_IDS, faultRanks=FAULTS,
                                                       nodeRank=INT32, detail=st.text(max_size=300))),
    st.tuples(st.just("ReportFinished"), st.builds(T.FinishRequest, jobId=JOB_IDS, nodeRank=INT32, exitCode=INT32,
                                                   message=TEXT)),
    st.tuples(st.just("ListJobs"), st.builds(T.JobQuery, jobId=JOB_IDS, pageSize=INT32, pageToken=TEXT)),
)
METHODS = ["/Recover/Init", "/Recover/Register", "/Recover/HealthCheck", "/Recover/ReportStopComplete",
           "/Recover/ReportRecoverStrategy", "/Recover/ReportRecoverStatus", "/Recover/ReportProcessFault",
           "/taskd.v1.AgentReport/ReportFinished", "/taskd.v1.JobStatus/ListJobs"]


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[str, ScriptedAgent, grpc.Channel]]:
    # every timer far away: a job the fuzzer created must not change by itself between two ListJobs
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.5, stop_timeout=3600,
                           strategy_timeout=3600, recover_timeout=3600, agent_loss_timeout=3600,
                           resume_timeout=3600)
    with EmbeddedController(cfg) as ctl:
        legit = ScriptedAgent(ctl.address, LEGIT, 0, 1, ranks_per_node=2).join(strategies=["recover", "exit"])
        with grpc.insecure_channel(ctl.address) as ch:
            yield ctl.address, legit, ch
        legit.close()


def snapshot(legit: ScriptedAgent) -> bytes:
    return legit.list_jobs().SerializeToString(deterministic=True)


def call(ch: grpc.Channel, method: str, request) -> tuple[grpc.StatusCode, int]:  # noqa: ANN001
    """(gRPC code, Status code or -1) of one call; a stream is read to its first message."""
    path = f"/taskd.v1.AgentReport/{method}" if method == "ReportFinished" else \
        f"/taskd.v1.JobStatus/{method}" if method == "ListJobs" else f"/Recover/{method}"
    data = request.SerializeToString()
    try:
        if method == "SubscribeProcessManageSignal":
            stream = ch.unary_stream(path)(data, timeout=TIMEOUT)
            try:
                next(iter(stream))
            finally:
                stream.cancel()
            return grpc.StatusCode.OK, 0
        reply = ch.unary_unary(path)(data, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code(), -1
    if method == "ListJobs":
        return grpc.StatusCode.OK, T.JobList.FromString(reply).status.code
    return grpc.StatusCode.OK, R.Status.FromString(reply).code


def check_answered(code: grpc.StatusCode) -> None:
    assert code is not None and code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                                             grpc.StatusCode.INTERNAL), code


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CALLS)
def test_every_call_is_answered_and_a_refused_one_changes_nothing(world, method_request) -> None:
    _, legit, ch = world
    method, request = method_request
    before = snapshot(legit)
    code, status = call(ch, method, request)
    check_answered(code)
    refused = code != grpc.StatusCode.OK or status != 0
    if refused:
        assert snapshot(legit) == before, (method, request)
    assert legit.health().code == 0


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(METHODS), st.binary(max_size=200))
def test_arbitrary_bytes_are_answered_and_change_nothing_when_refused(world, method: str, data: bytes) -> None:
    _, legit, ch = world
    before = snapshot(legit)
    try:
        reply = ch.unary_unary(method)(data, timeout=TIMEOUT)
        code = grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code, reply = exc.code(), b""
    check_answered(code)
    if code == grpc.StatusCode.OK:
        answer = T.JobList.FromString(reply).status if method.endswith("ListJobs") else R.Status.FromString(reply)
        refused = answer.code != 0
    else:
        refused = True
    if refused:
        assert snapshot(legit) == before


def test_the_legitimate_job_still_recovers_after_the_fuzzing(world) -> None:
    _, legit, _ = world
    jobs = legit.list_jobs().jobs
    assert len(jobs) > 1, "no fuzzed call got past validation: the fuzzer tested only the refusals"
    job = legit.list_jobs(LEGIT).jobs[0]
    assert job.state == "RUNNING" and job.restarts == 0 and not job.rounds
    assert legit.fault({1: 1}, detail="rank 1 killed").code == 0
    try:
        legit.expect("stopTrain")
        assert legit.stop_complete().code == 0
        legit.expect("globalFault")
        assert legit.strategies(["recover", "exit"]).code == 0
        legit.expect("changeStrategy", "recover")
        assert legit.status("recover").code == 0
    except StreamEnded as exc:
        raise AssertionError(f"the legitimate agent's stream ended: {exc}") from exc
    job = legit.list_jobs(LEGIT).jobs[0]
    assert job.state == "RUNNING" and job.restarts == 1 and job.rounds[0].outcome == "recovered"
