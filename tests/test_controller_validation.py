"""Every bad input gets its status code and an info naming the problem; the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from taskd.controller.server import ControllerConfig, EmbeddedController
from taskd.controller.testing import CALL_TIMEOUT, ScriptedAgent, fault_ranks
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code

R = recover_pb2


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[str, ScriptedAgent]]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.5)
    with EmbeddedController(cfg) as ctl:
        agent = ScriptedAgent(ctl.address, "vjob", node_rank=0, node_count=2)
        agent.join()  # node 1 of the 2-node job never registers
        yield ctl.address, agent
        agent.close()


@pytest.fixture(scope="module")
def stubs(env) -> Iterator[tuple[recover_pb2_grpc.RecoverStub, taskd_pb2_grpc.AgentReportStub,
                                 taskd_pb2_grpc.JobStatusStub]]:
    with grpc.insecure_channel(env[0]) as ch:
        yield recover_pb2_grpc.RecoverStub(ch), taskd_pb2_grpc.AgentReportStub(ch), taskd_pb2_grpc.JobStatusStub(ch)


LONG = "x" * 4097
FR = fault_ranks

CASES = {
    # name: (method, request, code, words in info)
    "empty jobId": ("ReportProcessFault", R.ProcessFaultRequest(jobId="", faultRanks=FR({1: 1})), 409, "jobId"),
    "over-long jobId": ("Init", R.ClientInfo(jobId=LONG), 409, "jobId"),
    "non-numeric rankId": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="abc", faultType="1")]), 409, "faultRanks[0].rankId"),
    "negative rankId": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="1"), R.FaultRank(rankId="-2", faultType="1")]),
        409, "faultRanks[1].rankId"),
    "fault type not 0/1/2": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="7")]), 409, "faultType"),
    "no fault ranks": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob"), 409, "faultRanks is empty"),
    "too many fault ranks": ("ReportProcessFault", R.ProcessFaultRequest(
        jobId="vjob", faultRanks=[R.FaultRank(rankId="1", faultType="1")] * 100_001), 409, "100001 entries"),
    "over-long detail": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob", faultRanks=FR({1: 1}),
                                                                     detail=LONG), 409, "detail"),
    "unknown strategy": ("ReportRecoverStrategy", R.RecoverStrategyRequest(jobId="vjob", strategies=["reboot"]),
                         409, "strategies[0] 'reboot'"),
    "unknown strategy in status": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="reboot"),
                                   409, "strategy 'reboot'"),
    "bad isolate rank": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="recover",
                                                                       isolateRankIds=["x"]), 409, "isolateRankIds"),
    "over-long status info": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob", status=R.Status(info=LONG)),
                              409, "status.info"),
    "negative nodeRank": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob", nodeRank=-1), 409, "nodeRank"),
    "unknown policy strategy": ("Init", R.ClientInfo(jobId="vjob", strategies=["fix-it"]), 409, "strategies[0]"),
    "negative maxRestarts": ("Init", R.ClientInfo(jobId="vjob", maxRestarts=-1), 409, "maxRestarts"),
    "register out of range": ("Register", R.ClientInfo(jobId="vjob", nodeRank=2), 409, "nodeRank 2 out of range"),
    "unknown job": ("ReportProcessFault", R.ProcessFaultRequest(jobId="nojob", faultRanks=FR({1: 1})), 402,
                    "job nojob does not exist"),
    "register unknown job": ("Register", R.ClientInfo(jobId="nojob"), 402, "does not exist"),
    "unregistered node": ("ReportProcessFault", R.ProcessFaultRequest(jobId="vjob", nodeRank=1, faultRanks=FR({1: 1})),
                          400, "node 1 of job vjob is not registered"),
    "health of unregistered node": ("HealthCheck", R.ClientInfo(jobId="vjob", nodeRank=1), 400, "not registered"),
    "health of unknown job": ("HealthCheck", R.ClientInfo(jobId="nojob"), 400, "does not exist"),
    "out of order": ("ReportStopComplete", R.StopCompleteRequest(jobId="vjob"), 401,
                     "job vjob is RUNNING, not STOPPING"),
    "status out of order": ("ReportRecoverStatus", R.RecoverStatusRequest(jobId="vjob", strategy="recover"), 401,
                            "RUNNING"),
}


@pytest.mark.parametrize("method,request_,code,words", CASES.values(), ids=CASES.keys())
def test_bad_input_is_answered_with_its_code(env, stubs, method: str, request_, code: int, words: str) -> None:
    recover, _, _ = stubs
    status = getattr(recover, method)(request_, timeout=CALL_TIMEOUT)
    assert status.code == code and words in status.info, status
    assert env[1].health().code == 0  # still serving, the job untouched
    assert env[1].list_jobs("vjob").jobs[0].state == "RUNNING"


def test_agent_report_and_status_service_inputs(stubs) -> None:
    _, reports, status = stubs
    bad = reports.ReportFinished(taskd_pb2.FinishRequest(jobId=""), timeout=CALL_TIMEOUT)
    assert bad.code == Code.INVALID_PARAMS and "jobId" in bad.info
    unknown = reports.ReportFinished(taskd_pb2.FinishRequest(jobId="nojob"), timeout=CALL_TIMEOUT)
    assert unknown.code == Code.JOB_NOT_EXIST
    unregistered = reports.ReportFinished(taskd_pb2.FinishRequest(jobId="vjob", nodeRank=1), timeout=CALL_TIMEOUT)
    assert unregistered.code == Code.NOT_REGISTERED
    missing = status.ListJobs(taskd_pb2.JobQuery(jobId="nojob"), timeout=CALL_TIMEOUT)
    assert missing.status.code == Code.JOB_NOT_EXIST and not missing.jobs


@pytest.mark.parametrize("info,grpc_code,code", [
    (R.ClientInfo(jobId="nojob"), grpc.StatusCode.NOT_FOUND, "402"),
    (R.ClientInfo(jobId="vjob", nodeRank=1), grpc.StatusCode.FAILED_PRECONDITION, "400"),
    (R.ClientInfo(jobId=""), grpc.StatusCode.INVALID_ARGUMENT, "409"),
], ids=["unknown job", "unregistered", "empty job id"])
def test_bad_subscription_ends_with_the_code(stubs, env, info, grpc_code, code: str) -> None:
    recover, _, _ = stubs
    call = recover.SubscribeProcessManageSignal(info, timeout=CALL_TIMEOUT)
    with pytest.raises(grpc.RpcError) as err:
        next(iter(call))
    assert err.value.code() == grpc_code and err.value.details().startswith(code)
    assert env[1].health().code == 0
