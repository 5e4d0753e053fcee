"""A node that finished while a round was open for another node's rank (issue 21, D3 across nodes): its agent
has left and its ranks will never rejoin, so the controller ends the job at once instead of waiting out the
stop timeout and choosing a recover (or a job-rescheduling) whose ranks would wait for peers that are gone.
Scripted agents over a real gRPC server; the controller's stop and strategy timeouts are 60 s, every wait
here is 5 s."""

from __future__ import annotations

import json
import time

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController

WAIT = 5.0


@pytest.fixture
def nodes():  # noqa: ANN201
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:"))
    address = ctl.start()
    agents = [ScriptedAgent(address, "d3", node_rank=n, node_count=2, ranks_per_node=2) for n in range(2)]
    try:
        for a in agents:
            a.join()
        yield agents
    finally:
        for a in agents:
            a.close()
        ctl.stop()


def ends_with_exit(agent: ScriptedAgent) -> str:
    sig = agent.expect("changeStrategy", "exit", timeout=WAIT)
    return json.loads(sig.extraParams)["reason"]


def state(agent: ScriptedAgent) -> str:
    return agent.list_jobs("d3").jobs[0].state


def test_a_node_finishing_while_the_round_stops_ends_the_job_at_once(nodes) -> None:  # noqa: ANN001
    finished, faulty = nodes
    assert faulty.fault({3: 1}).code == 0  # rank 3 died after its last step (gloo's teardown abort)
    faulty.expect("stopTrain", timeout=WAIT)
    finished.expect("stopTrain", timeout=WAIT)
    assert faulty.stop_complete(faults={3: 1}).code == 0
    t0 = time.monotonic()
    assert finished.finished(0).code == 0  # node 0's ranks ended 0; its agent leaves without answering
    reason = ends_with_exit(faulty)
    assert time.monotonic() - t0 < WAIT  # not the 60 s stop timeout
    assert "node(s) 0 finished while round 1 was open for rank(s) 3" in reason, reason
    job = faulty.list_jobs("d3").jobs[0]
    assert job.state == "FAILED" and [r.strategiesTried for r in job.rounds] == [["exit"]]


def test_a_node_finishing_after_offering_recover_never_gets_it_chosen(nodes) -> None:  # noqa: ANN001
    finished, faulty = nodes
    assert faulty.fault({3: 1}).code == 0
    for a in nodes:
        a.expect("stopTrain", timeout=WAIT)
        assert a.stop_complete(faults={3: 1}).code == 0
    for a in nodes:
        a.expect("globalFault", timeout=WAIT)
    assert finished.strategies(["recover", "job-rescheduling", "exit"], faults={3: 1}).code == 0
    assert finished.finished(0).code == 0  # then its ranks finished and its agent left
    assert "node(s) 0 finished while round 1 was open" in ends_with_exit(faulty)
    assert state(faulty) == "FAILED"
    # the faulty node's late offer changes nothing: the job is over
    assert faulty.strategies(["recover", "job-rescheduling", "exit"], faults={3: 1}).code != 0
    assert [r.strategiesTried for r in faulty.list_jobs("d3").jobs[0].rounds] == [["exit"]]


def test_a_fault_after_a_node_finished_still_fails_at_once(nodes) -> None:  # noqa: ANN001
    finished, faulty = nodes
    assert finished.finished(0).code == 0
    assert faulty.fault({2: 1}).code == 0
    assert "rank(s) 2 failed after node(s) 0 had finished" in ends_with_exit(faulty)
    assert state(faulty) == "FAILED"


def test_the_faulty_node_finishing_itself_is_no_doomed_round(nodes) -> None:  # noqa: ANN001
    """A node whose own rank is the round's fault that then finishes 0 (the rank retried in place and ended)
    does not end the job: only a node holding none of the round's fault ranks does."""
    other, faulty = nodes
    assert faulty.fault({3: 0}).code == 0
    other.expect("stopTrain", timeout=WAIT)
    assert faulty.finished(0).code == 0
    assert state(other) == "STOPPING"
    other.no_signal(0.3)
