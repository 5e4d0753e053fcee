"""`taskd status` against a real controller holding a recovered fault."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.cli import main as taskd_main
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.status_view import fetch_jobs, render_json, render_text

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A controller with job "train" that recovered from a fault of rank 3 (and escalated once)."""
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=1.0)
    with EmbeddedController(cfg) as ctl:
        agents = [ScriptedAgent(ctl.address, "train", n, 2, ranks_per_node=2).join() for n in range(2)]
        ok(agents[1].fault({3: 1}, detail="rank 3 pid 4242 killed by signal 9"))
        for a in agents:
            a.expect("stopTrain")
            ok(a.stop_complete())
        for a in agents:
            a.expect("globalFault")
            ok(a.strategies(ALL))
        for a in agents:
            a.expect("changeStrategy", "recover")
        ok(agents[0].status("recover", code=1, info="spawn failed"))
        for a in agents:
            a.expect("changeStrategy", "job-rescheduling")
            ok(a.status("job-rescheduling"))
        ScriptedAgent(ctl.address, "other", 0, 1).join().close()
        yield ctl.address
        for a in agents:
            a.close()


def test_fetch_and_render_text(server: str) -> None:
    jobs = fetch_jobs(server)
    assert [j.jobId for j in jobs.jobs] == ["train", "other"]
    text = render_text(jobs)
    assert "job train: RUNNING" in text and "job other: RUNNING" in text
    assert "restarts 1/3" in text  # a recover that failed and escalated to job-rescheduling: one restart in all
    assert "rank 3 (type 1)" in text and "recover -> job-rescheduling" in text and "recovered" in text
    assert "rank 3 pid 4242 killed by signal 9" in text  # the fault's detail, in the event list
    round_line = next(line for line in text.splitlines() if "rank 3 (type 1)" in line)
    assert round_line.split()[-2].endswith("s")  # a duration (to the last recover status)
    assert round_line.split()[-1] == "-"  # to training resumed: no agent here said so (they do not ReportResumed)
    train = text.split("job other")[0]
    node_lines = [cols for cols in map(str.split, train.splitlines()) if len(cols) > 1 and cols[1] == "localhost"]
    assert ["0-1", "2-3"] == [cols[3] for cols in node_lines]  # global ranks of each node


def test_render_json_and_filter(server: str) -> None:
    data = json.loads(render_json(fetch_jobs(server, "train")))
    (job,) = data["jobs"]
    assert job["jobId"] == "train" and job["state"] == "RUNNING"
    (rnd,) = job["rounds"]
    assert rnd["outcome"] == "recovered" and rnd["strategy"] == "job-rescheduling"
    assert rnd["strategiesTried"] == ["recover", "job-rescheduling"] and rnd["durationSeconds"] > 0
    assert rnd["faultRanks"] == [{"rankId": "3", "faultType": "1"}]
    fault = next(e for e in job["events"] if e["kind"] == "fault_reported")
    assert fault["detail"]["faults"] == "3:1" and fault["time"] > 0


@pytest.mark.usefixtures("taskd_logging")
def test_taskd_status_command(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert taskd_main(["status", "--server", server, "--job", "train"]) == 0
    out = capsys.readouterr().out
    assert "job train: RUNNING" in out and "other" not in out
    assert taskd_main(["status", "--server", server, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"]) == 2
    assert taskd_main(["status", "--server", server, "--job", "nope"]) == 1
    assert "402" in capsys.readouterr().out


@pytest.mark.usefixtures("taskd_logging")
def test_taskd_status_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert taskd_main(["status", "--server", "127.0.0.1:1", "--timeout", "1"]) == 1
    assert "cannot reach the controller at 127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.usefixtures("taskd_logging")
def test_taskd_status_pages_past_4_mb(capsys: pytest.CaptureFixture[str]) -> None:
    """400 jobs of ~12 KB each: one ListJobs answer would pass a client's 4 MB limit; taskd status pages."""
    import grpc

    from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc

    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:")) as ctl:
        with grpc.insecure_channel(ctl.address) as ch:
            stub = recover_pb2_grpc.RecoverStub(ch)
            for i in range(400):
                info = recover_pb2.ClientInfo(jobId=f"big-{i:03d}", host="h" * 4000, pid=1, nodeCount=1)
                assert stub.Init(info, timeout=10).code == 0 and stub.Register(info, timeout=10).code == 0
            with pytest.raises(grpc.RpcError) as err:  # the whole list at once, as a caller without paging asks
                taskd_pb2_grpc.JobStatusStub(ch).ListJobs(taskd_pb2.JobQuery(), timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            page = taskd_pb2_grpc.JobStatusStub(ch).ListJobs(taskd_pb2.JobQuery(pageSize=1000), timeout=30)
            assert 0 < len(page.jobs) < 400 and page.nextPageToken and page.ByteSize() < 4 << 20
        jobs = fetch_jobs(ctl.address, timeout=30)
        assert [j.jobId for j in jobs.jobs] == [f"big-{i:03d}" for i in range(400)]
        assert taskd_main(["status", "--server", ctl.address, "--json", "--timeout", "30"]) == 0
        assert len(json.loads(capsys.readouterr().out)["jobs"]) == 400


def test_a_page_token_the_server_did_not_give_is_refused(server: str) -> None:
    from support.scripted_agent import CALL_TIMEOUT

    from taskd.proto import taskd_pb2

    agent = ScriptedAgent(server, "pager", 0, 1)
    try:
        first = agent.status_stub.ListJobs(taskd_pb2.JobQuery(pageSize=1), timeout=CALL_TIMEOUT)
        assert [j.jobId for j in first.jobs] == ["train"] and first.nextPageToken
        second = agent.status_stub.ListJobs(taskd_pb2.JobQuery(pageSize=1, pageToken=first.nextPageToken),
                                            timeout=CALL_TIMEOUT)
        assert [j.jobId for j in second.jobs] == ["other"] and not second.nextPageToken
        bad = agent.status_stub.ListJobs(taskd_pb2.JobQuery(pageSize=1, pageToken="nonsense"), timeout=CALL_TIMEOUT)
        assert bad.status.code == 409 and "pageToken" in bad.status.info
    finally:
        agent.close()
