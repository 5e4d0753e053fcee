"""The status credential (issue 31, F4): what an embedded controller's locator holds reads jobs and changes none.

Every process of the user can read a locator, every rank included; so the credential in it may make
`ListJobs` (what `taskd status` calls) and nothing else. A real controller with an admin token and a live
agent of job `victim`; every other call, with the status credential, is refused before the servicer runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from support.scripted_agent import CALL_TIMEOUT, VICTIM_CALLS, ScriptedAgent, bearer_stubs

from taskd.controller.service.auth import job_credential, status_credential
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, taskd_pb2

R, T = recover_pb2, taskd_pb2
ADMIN = "admin-token-for-tests-0123456789abcdef"
CONTROL_CALLS = {name: call for name, call in VICTIM_CALLS.items() if name != "ListJobs of the victim"}  # it may read


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
    ch, r, a, s = bearer_stubs(address, status_credential(ADMIN))
    with ch, pytest.raises(grpc.RpcError) as err:
        CONTROL_CALLS[name](r, a, s)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
    assert "status credential" in err.value.details() and "only reads jobs" in err.value.details()
    after = victim.list_jobs("victim")
    assert after == before and after.jobs[0].state == "RUNNING" and after.jobs[0].restarts == 0
    victim.next_signal(timeout=CALL_TIMEOUT, keepalive=True)  # the victim's stream is still its own


def test_a_status_credential_lists_every_job_and_one_of_another_controller_is_refused(ctl) -> None:
    address, _ = ctl
    ch, _, _, s = bearer_stubs(address, status_credential(ADMIN))
    with ch:
        assert [j.jobId for j in s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT).jobs] == ["victim"]
        assert s.ListJobs(T.JobQuery(jobId="victim"), timeout=CALL_TIMEOUT).jobs[0].state == "RUNNING"
    ch, _, _, s = bearer_stubs(address, status_credential("some-other-token-0123456789abcdef"))
    with ch, pytest.raises(grpc.RpcError) as err:
        s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not made from this controller's token" in err.value.details()
