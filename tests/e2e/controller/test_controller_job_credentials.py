"""Per-job credentials (issue 19 item 1): a job credential reaches exactly its own job; the admin token all.

A real controller with an admin token; jobs `victim` and `tenant`, each with a live agent. The tenant holds
only its own credential (`taskd token --job tenant`) and tries every RPC against the victim.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import secret_file
from support.scripted_agent import CALL_TIMEOUT, VICTIM_CALLS, ScriptedAgent, StreamEnded, bearer_stubs

from taskd.controller.service.auth import job_credential
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2, taskd_pb2

R, T = recover_pb2, taskd_pb2
ADMIN = "admin-token-for-tests-0123456789abcdef"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ctl() -> Iterator[tuple[str, ScriptedAgent, ScriptedAgent]]:
    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=ADMIN,
                                             keepalive_interval=0.5)) as c:
        victim = ScriptedAgent(c.address, "victim", host="v-host", pid=111,
                               token=job_credential(ADMIN, "victim")).join()
        tenant = ScriptedAgent(c.address, "tenant", host="t-host", pid=222,
                               token=job_credential(ADMIN, "tenant")).join()
        yield c.address, victim, tenant
        victim.close()
        tenant.close()


@pytest.mark.parametrize("name", VICTIM_CALLS)
def test_a_job_credential_cannot_read_or_change_another_job(ctl, name: str) -> None:
    address, victim, _ = ctl
    before = victim.list_jobs("victim")
    ch, r, a, s = bearer_stubs(address, job_credential(ADMIN, "tenant"))
    with ch, pytest.raises(grpc.RpcError) as err:
        VICTIM_CALLS[name](r, a, s)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value
    assert "'tenant'" in err.value.details() and "'victim'" in err.value.details()
    after = victim.list_jobs("victim")
    assert after == before and after.jobs[0].state == "RUNNING" and after.jobs[0].restarts == 0
    victim.next_signal(timeout=CALL_TIMEOUT, keepalive=True)  # the victim's stream is still its own


def test_a_job_credential_cannot_list_every_job(ctl) -> None:
    address, _, _ = ctl
    ch, _, _, s = bearer_stubs(address, job_credential(ADMIN, "tenant"))
    with ch, pytest.raises(grpc.RpcError) as err:
        s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "listing every job needs the admin token" in err.value.details()


def test_a_job_credential_does_its_own_job(ctl) -> None:
    address, _, tenant = ctl
    assert tenant.health().code == 0
    jobs = tenant.list_jobs("tenant")
    assert [j.jobId for j in jobs.jobs] == ["tenant"]
    assert tenant.fault({0: 1}).code == 0  # its own fault: a round opens
    tenant.expect("stopTrain")


def test_the_admin_token_reads_and_changes_every_job_and_a_forged_credential_is_refused(ctl) -> None:
    address, _, _ = ctl
    ch, r, _, s = bearer_stubs(address, ADMIN)
    with ch:
        assert {j.jobId for j in s.ListJobs(T.JobQuery(), timeout=CALL_TIMEOUT).jobs} >= {"victim", "tenant"}
        assert r.HealthCheck(R.ClientInfo(jobId="victim"), timeout=CALL_TIMEOUT).code == 0
        assert r.Init(R.ClientInfo(jobId="admin-made", nodeCount=1, ranksPerNode=1), timeout=CALL_TIMEOUT).code == 0
    forged = job_credential("some-other-token-0123456789abcdef", "victim")
    ch, r, _, _ = bearer_stubs(address, forged)
    with ch, pytest.raises(grpc.RpcError) as err:
        r.HealthCheck(R.ClientInfo(jobId="victim"), timeout=CALL_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "not minted from this controller" in \
        err.value.details()


def test_a_job_credential_cannot_take_over_another_jobs_node_stream(ctl) -> None:
    address, victim, _ = ctl
    thief = ScriptedAgent(address, "victim", host="v-host", pid=111, token=job_credential(ADMIN, "tenant"))
    try:
        thief.subscribe()
        with pytest.raises(StreamEnded) as err:
            thief.next_signal(timeout=CALL_TIMEOUT)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        thief.close()
    victim.next_signal(timeout=CALL_TIMEOUT, keepalive=True)


def test_taskd_token_mints_what_the_controller_accepts(tmp_path: Path) -> None:
    admin = secret_file(tmp_path / "admin", ADMIN + "\n")
    out = subprocess.run([sys.executable, "-m", "taskd", "token", "--job", "victim", "--token-file", str(admin)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == job_credential(ADMIN, "victim") and ADMIN not in out.stdout
    cred = tmp_path / "victim.cred"
    cred.write_text(out.stdout)
    again = subprocess.run([sys.executable, "-m", "taskd", "token", "--job", "x", "--token-file", str(cred)],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert again.returncode == 2 and "only the admin token mints" in again.stderr
