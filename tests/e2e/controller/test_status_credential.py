"""The status credential (issue 31, F4): what an embedded controller's locator holds reads jobs and changes none.

Every process of the user can read a locator, every rank included; so the credential in it may make
`ListJobs` (what `taskd status` calls) and nothing else. A real controller with an admin token and a live
agent of job `victim`; every other call, with the status credential, is refused before the servicer runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from support.scripted_agent import CALL_TIMEOUT, Bearer, ScriptedAgent, fault_ranks

from taskd.controller.auth import job_credential, status_credential
from taskd.controller.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc

R, T = recover_pb2, taskd_pb2
ADMIN = "admin-token-for-tests-0123456789abcdef"
CONTROL_CALLS = {  # every call but ListJobs, each naming the victim as its own agent would
    "Init": lambda r, a: r.Init(R.ClientInfo(jobId="victim", nodeCount=1, ranksPerNode=1), timeout=CALL_TIMEOUT),
    "Register": lambda r, a: r.Register(R.ClientInfo(jobId="victim", host="v-host", pid=111), timeout=CALL_TIMEOUT),
    "HealthCheck": lambda r, a: r.HealthCheck(R.ClientInfo(jobId="victim"), timeout=CALL_TIMEOUT),
    "ReportProcessFault": lambda r, a: r.ReportProcessFault(
        R.ProcessFaultRequest(jobId="victim", faultRanks=fault_ranks({0: 1}), host="v-host", pid=111),
        timeout=CALL_TIMEOUT),
    "ReportStopComplete": lambda r, a: r.ReportStopComplete(R.StopCompleteRequest(jobId="victim"),
                                                            timeout=CALL_TIMEOUT),
    "ReportRecoverStrategy": lambda r, a: r.ReportRecoverStrategy(
        R.RecoverStrategyRequest(jobId="victim", strategies=["exit"]), timeout=CALL_TIMEOUT),
    "ReportRecoverStatus": lambda r, a: r.ReportRecoverStatus(R.RecoverStatusRequest(jobId="victim", strategy="exit"),
                                                              timeout=CALL_TIMEOUT),
    "ReportFinished": lambda r, a: a.ReportFinished(T.FinishRequest(jobId="victim", exitCode=1), timeout=CALL_TIMEOUT),
    "SubscribeProcessManageSignal": lambda r, a: next(iter(r.SubscribeProcessManageSignal(
        R.ClientInfo(jobId="victim", host="v-host", pid=111), timeout=CALL_TIMEOUT))),
}


def stubs(address: str, token: str):  # noqa: ANN201
    ch = grpc.intercept_channel(grpc.insecure_channel(address), Bearer(token))
    return ch, recover_pb2_grpc.RecoverStub(ch), taskd_pb2_grpc.AgentReportStub(ch), taskd_pb2_grpc.JobStatusStub(ch)


@pytest.fixture(scope="module")
def ctl() -> Iterator[tuple[str, ScriptedAgent]]:
    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=ADMIN,
                                             keepalive_interval=0.5)) as c:
        victim = ScriptedAgent(c.address, "victim", host="v-host", pid=111,
                               token=job_credential(ADMIN, "victim")).join()
        yield c.address, victim
        victim.close()


@pytest.mark.parametrize("name", CONTROL_CALLS)
def test_a_status_credential_changes_nothing(ctl, name: str) -> None:
    address, victim = ctl
    before = victim.list_jobs("victim")
    ch, r, a, _ = stubs(address, status_credential(ADMIN))
    with ch, pytest.raises(grpc.RpcError) as err:
        CONTROL_CALLS[name](r, a)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
    assert "status credential" in err.value.details() and "only reads jobs" in err.value.details()
    after = victim.list_jobs("victim")
    assert after == before and after.jobs[0].state == "RUNNING" and after.jobs[0].restarts == 0
    victim.next_signal(timeout=CALL_TIMEOUT, keepalive=True)  # the victim's stream is still its own


def test_a_status_credential_lists_every_job_and_one_of_another_controller_is_refused(ctl) -> None:
    address, _ = ctl
    ch, _, _, s = stubs(address, status_credential(ADMIN))
    with ch:
        assert [j.jobId for j in s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT).jobs] == ["victim"]
        assert s.ListJobs(T.JobQuery(jobId="victim"), timeout=CALL_TIMEOUT).jobs[0].state == "RUNNING"
    ch, _, _, s = stubs(address, status_credential("some-other-token-0123456789abcdef"))
    with ch, pytest.raises(grpc.RpcError) as err:
        s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not made from this controller's token" in err.value.details()
