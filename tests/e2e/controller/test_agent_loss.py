"""A lost agent over real gRPC: its stream closes, it neither comes back nor finishes. Since issue 17 that opens
a node-loss round; without a replacement within the rejoin timeout (short here) the job ends, the others exit.
(tests/e2e/controller/test_controller_node_loss.py has the replacement.)"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.client.errors import FencedError
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2
from taskd.toolkit.recover_module.recover_manager import DLRecoverManager
from taskd.vocabulary import Code

LOSS_TIMEOUT = 2.0
REJOIN_TIMEOUT = 1.0
_ids = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2,
                           agent_loss_timeout=LOSS_TIMEOUT, node_rejoin_timeout=REJOIN_TIMEOUT)
    with EmbeddedController(cfg) as ctl:
        yield ctl.address


@pytest.fixture
def job(server: str) -> Iterator[Callable[[], list[ScriptedAgent]]]:
    made: list[ScriptedAgent] = []

    def make(nodes: int = 2) -> list[ScriptedAgent]:
        job_id = f"loss-{next(_ids)}"
        agents = [ScriptedAgent(server, job_id, node_rank=n, node_count=nodes).join() for n in range(nodes)]
        made.extend(agents)
        return agents

    yield make
    for a in made:
        a.close()


def record(agent: ScriptedAgent):  # noqa: ANN201
    jobs = agent.list_jobs(agent.job_id)
    assert jobs.status.code == 0, jobs.status.info
    return jobs.jobs[0]


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def unsubscribed(agent: ScriptedAgent) -> Callable[[], bool]:
    def check() -> bool:
        rec = record(agent)
        return not next(a for a in rec.agents if a.nodeRank == agent.node_rank).subscribed
    return check


def test_lost_agent_without_replacement_fails_the_job_and_the_others_exit_then_a_returning_one_is_killed(job) -> None:
    node0, node1 = job()
    node1.unsubscribe()  # its process died: the stream closes, no ReportFinished
    node0.expect("stopTrain", timeout=LOSS_TIMEOUT + 30)  # a node-loss round: node 1's rank
    assert node0.stop_complete(faults={1: 1}).code == 0
    node0.expect("globalFault")
    assert node0.strategies(["recover", "job-rescheduling", "exit"], faults={1: 1}).code == 0
    node0.expect("changeStrategy", "exit", timeout=REJOIN_TIMEOUT + 30)  # nobody replaced node 1
    rec = record(node0)
    assert rec.state == "FAILED"
    assert rec.info.startswith("node(s) 1 lost and no replacement joined within 1 s (--node-rejoin-timeout)")
    (lost,) = [e for e in rec.events if e.kind == "node_lost"]
    assert '"node_rank": 1' in lost.detail
    assert rec.rounds[-1].outcome == "failed" and rec.rounds[-1].strategy == "exit"
    assert node0.status("exit").code == 0  # the remaining agent confirms as usual
    # the lost agent comes back (same host and pid): fenced, in a finished job too (issue 31), so it stops its ranks
    # and exits 1; nothing of the failed job changes
    for answer in (node1.init(), node1.register(), node1.health()):
        assert answer.code == Code.FENCED and "the job is FAILED: this agent must stop its ranks" in answer.info
    node1.subscribe()
    fenced = node1.expect("taskd.fenced")
    assert "declared lost" in json.loads(fenced.extraParams)["reason"]
    assert record(node0).state == "FAILED"


def test_reconnect_within_the_timeout_keeps_the_job(job) -> None:
    node0, node1 = job()
    node1.unsubscribe()
    wait_until(unsubscribed(node1), 30, "the controller to see node 1's stream close")
    node1.subscribe()  # a network blip
    node0.no_signal(LOSS_TIMEOUT + 1.5)  # past the loss timeout: nothing happened
    rec = record(node0)
    assert rec.state == "RUNNING" and "agent_lost" not in [e.kind for e in rec.events]


def test_an_agent_that_finished_is_not_lost(job) -> None:
    node0, node1 = job()
    assert node1.finished(0).code == 0
    node1.unsubscribe()
    wait_until(unsubscribed(node1), 30, "the controller to see node 1's stream close")
    node0.no_signal(LOSS_TIMEOUT + 1.5)
    assert record(node0).state == "RUNNING"
    assert node0.finished(0).code == 0
    assert record(node0).state == "SUCCEEDED"


def test_single_agent_job_whose_agent_is_lost_becomes_failed(job) -> None:
    (node0,) = job(nodes=1)
    node0.unsubscribe()
    wait_until(lambda: record(node0).state == "FAILED", LOSS_TIMEOUT + REJOIN_TIMEOUT + 30, "the job to fail")
    assert "node(s) 0 lost and no replacement joined" in record(node0).info


def test_real_client_back_on_a_failed_job_it_was_declared_lost_from_is_fenced(server: str, job) -> None:
    """DLRecoverManager's own reconnect path (Init) after it was declared lost: refused as fenced (issue 31)."""
    (node0,) = job(nodes=1)
    info = recover_pb2.ClientInfo(jobId=node0.job_id, role="agent", nodeRank=0, nodeCount=1, ranksPerNode=1,
                                  host=node0.info.host, pid=node0.info.pid)  # the same agent process
    node0.unsubscribe()
    wait_until(lambda: record(node0).state == "FAILED", LOSS_TIMEOUT + REJOIN_TIMEOUT + 30, "the job to fail")
    mgr = DLRecoverManager(info, server, backoff_initial=0.05, backoff_max=0.3, call_timeout=5)
    try:
        with pytest.raises(FencedError, match="the job is FAILED"):
            mgr.init_clusterd()
        with pytest.raises(FencedError, match="declared lost"):
            mgr.register()
        assert record(node0).state == "FAILED"  # the returning agent did not reset the job
    finally:
        mgr.stop()


@pytest.mark.parametrize("value,needle", [("0", "--agent-loss-timeout must be > 0"),
                                          ("-1", "--agent-loss-timeout must be > 0"),
                                          ("soon", "invalid float value")])
def test_bad_agent_loss_timeout_is_a_clear_error(value: str, needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state", ":memory:",
                          "--agent-loss-timeout", value], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
