"""taskd.v1 ReportPace over a real gRPC server: stragglers judged across nodes, recorded in the history and
`taskd status`, handed once to the straggler's node; bad input and calls without the token refused."""

from __future__ import annotations

import grpc
import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.status_view import render_text
from taskd.proto import taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code

TOKEN = "a-token-for-tests-0123456789abcdef"


@pytest.fixture
def two_nodes():  # noqa: ANN201
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=TOKEN))
    address = ctl.start()
    agents = [ScriptedAgent(address, "j", node_rank=n, node_count=2, ranks_per_node=2, host=f"node{n}", token=TOKEN)
              for n in range(2)]
    try:
        for a in agents:
            a.join()
        yield address, agents
    finally:
        for a in agents:
            a.close()
        ctl.stop()


def kinds(agent: ScriptedAgent) -> list[str]:
    return [e.kind for e in agent.list_jobs("j").jobs[0].events]


def test_a_slow_rank_is_judged_against_the_whole_job_and_told_to_its_node_once(two_nodes) -> None:  # noqa: ANN001
    _, (a, b) = two_nodes
    reply = a.pace({0: 0.10, 1: 0.11})
    assert reply.status.code == Code.OK and not reply.verdicts
    reply = b.pace({2: 0.09, 3: 0.40})  # rank 3: 0.40 s against the median of ranks 0-2 (0.10 s)
    assert reply.status.code == Code.OK
    [v] = reply.verdicts
    assert (v.rank, v.nodeRank, v.host, v.cleared) == (3, 1, "node1", False)
    assert v.ratio == pytest.approx(4.0) and v.medianSeconds == pytest.approx(0.10)
    assert not a.pace({0: 0.10, 1: 0.11}).verdicts  # node 0's ranks are fine; rank 3 is node 1's news
    assert not b.pace({2: 0.09, 3: 0.42}).verdicts  # still the same straggler: said once
    job = a.list_jobs("j").jobs[0]
    [s] = job.stragglers
    assert (s.rank, s.nodeRank, s.host) == (3, 1, "node1") and s.since > 0
    assert kinds(a).count("straggler") == 1
    text = render_text(a.list_jobs("j"))
    assert "stragglers" in text and "rank 3 (node 1, node1): 4.00x" in text and "straggler" in text
    [cleared] = b.pace({2: 0.09, 3: 0.10}).verdicts  # it caught up
    assert cleared.rank == 3 and cleared.cleared
    assert not a.list_jobs("j").jobs[0].stragglers and "straggler_cleared" in kinds(a)


def test_bad_pace_reports_are_refused_saying_why_and_change_nothing(two_nodes) -> None:  # noqa: ANN001
    address, (a, b) = two_nodes
    refused = {
        "factor": a.pace({0: 0.1}, factor=1.0),
        "negative": a.pace({0: -0.5}),
        "infinite": a.pace({0: float("inf")}),
        "other node": a.pace({0: 0.1, 3: 0.9}),  # rank 3 is node 1's
    }
    info = {k: r.status.info for k, r in refused.items()}
    assert refused["factor"].status.code == Code.INVALID_PARAMS and "factor must be a number above 1" in info["factor"]
    assert refused["negative"].status.code == Code.INVALID_PARAMS and "computeSeconds" in info["negative"]
    assert refused["infinite"].status.code == Code.INVALID_PARAMS
    assert refused["other node"].status.code != Code.OK and "3" in refused["other node"].status.info
    stranger = ScriptedAgent(address, "j", node_rank=5, node_count=2, token=TOKEN)
    try:
        assert stranger.pace({10: 0.1}).status.code != Code.OK  # no such node
    finally:
        stranger.close()
    assert not any(k.startswith("straggler") for k in kinds(a)) and not a.list_jobs("j").jobs[0].stragglers
    with grpc.insecure_channel(address) as channel:  # no token: refused before the request is read
        stub = taskd_pb2_grpc.AgentReportStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportPace(taskd_pb2.PaceRequest(jobId="j", nodeRank=1, factor=1.5, ranks=[
                taskd_pb2.RankPace(rank=3, computeSeconds=9.0, steps=10)]), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not any(k.startswith("straggler") for k in kinds(a))
