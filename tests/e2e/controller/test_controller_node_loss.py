"""Issue 17 over real gRPC (127.0.0.1, port 0, fake agents built from the real client and raw stubs): a node
that finished while the controller was down is finished, not lost; a lost node is survived."""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.client import FencedError, RecoverClient
from taskd.client.credentials import ClientCredentials
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.status_view import render_text
from taskd.launcher.spec import free_port
from taskd.proto import recover_pb2

LOSS = 2.0
_ids = itertools.count()


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def record(agent: ScriptedAgent):  # noqa: ANN201
    jobs = agent.list_jobs(agent.job_id)
    assert jobs.status.code == 0, jobs.status.info
    return jobs.jobs[0]


def test_a_node_that_finished_while_the_controller_was_down_is_finished_not_lost(tmp_path: Path) -> None:
    """N1: node 0 ends while the controller is down; its ReportFinished is re-sent until the restarted
    controller acknowledges it, and the controller counts the node finished: node 1 runs on, past the loss
    timeout, and the job succeeds when it ends."""
    state, port = tmp_path / "ctl.sqlite3", free_port()
    cfg = ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(state), keepalive_interval=0.3,
                           agent_loss_timeout=LOSS)
    ctl = EmbeddedController(cfg)
    address = ctl.start()
    job = f"n1-{next(_ids)}"
    info = recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=0, nodeCount=2, ranksPerNode=1)
    # each call waits at most 1 s (wait_for_ready): the outage below outlasts one call, not the report's budget
    node0 = RecoverClient(info, address, credentials=ClientCredentials(), call_timeout=1.0)
    stream0 = ScriptedAgent(address, job, node_rank=0, node_count=2, host=socket.gethostname(), pid=os.getpid())
    node1 = ScriptedAgent(address, job, node_rank=1, node_count=2)
    second: EmbeddedController | None = None
    try:
        stream0.join()
        assert node0.register().code == 0  # the same process as stream0's agent: a re-register
        node1.join()
        ctl.stop()  # the controller goes down (its state is on disk) ...
        answers: list[object] = []

        def finish() -> None:
            try:
                answers.append(node0.report_finished(0, "", timeout=30))
            except Exception as exc:  # noqa: BLE001 - the test reports what came back
                answers.append(exc)

        sender = threading.Thread(target=finish, daemon=True)
        sender.start()  # ... while node 0's ranks have all ended
        sender.join(2.5)
        assert sender.is_alive(), f"ReportFinished gave up while the controller was down: {answers}"
        second = EmbeddedController(cfg)
        second.start()
        sender.join(30)
        assert answers == [0], answers
        node1.join()  # node 1's agent resubscribes; node 0's never will: it has ended
        node1.no_signal(LOSS + 1.5)  # past the loss timeout: node 0 is finished, not lost
        rec = record(node1)
        assert rec.state == "RUNNING", rec.info
        (a0,) = [a for a in rec.agents if a.nodeRank == 0]
        assert a0.finished and a0.exitCode == 0
        assert node1.finished(0).code == 0
        assert record(node1).state == "SUCCEEDED"
    finally:
        node0.stop()
        stream0.close()
        node1.close()
        if second is not None:
            second.stop()
        ctl.stop()


BOTH = ["recover", "job-rescheduling", "dump", "exit"]


def test_a_lost_node_is_replaced_fenced_and_recovered_over_grpc() -> None:
    """Node 1's agent dies (its stream ends): node 0 gets stopTrain/globalFault for node 1's ranks, the job
    waits (REJOINING, `rejoining` [1]); the old agent coming back is fenced (411 to its Register, one
    `taskd.fenced` signal on its stream, FencedError and no resubscription in the real client); a replacement
    on another host registers and subscribes, both get changeStrategy recover, the job runs on, and its
    status shows the node, old and new host, and the time from the loss to the round's end."""
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2,
                           agent_loss_timeout=LOSS, agent_loss_grace=0.5, node_rejoin_timeout=60)
    job = f"loss-{next(_ids)}"
    with EmbeddedController(cfg) as ctl:
        node0 = ScriptedAgent(ctl.address, job, node_rank=0, node_count=2, ranks_per_node=2, host="a").join()
        node1 = ScriptedAgent(ctl.address, job, node_rank=1, node_count=2, ranks_per_node=2, host="b").join()
        new1 = ScriptedAgent(ctl.address, job, node_rank=1, node_count=2, ranks_per_node=2, host="c", pid=4242)
        fenced_seen: list[object] = []
        old = RecoverClient(recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=1, nodeCount=2, ranksPerNode=2,
                                                   host="b", pid=node1.info.pid), ctl.address,
                            credentials=ClientCredentials(), call_timeout=2.0)
        try:
            node1.unsubscribe()  # node 1's taskd run is SIGKILLed
            stop = node0.expect("stopTrain", timeout=LOSS + 10)
            assert sorted(int(f.rankId) for f in stop.faultRanks) == [2, 3] and list(stop.nodeRankIds) == ["1"]
            assert node0.stop_complete(faults={2: 1, 3: 1}).code == 0
            node0.expect("globalFault")
            assert node0.strategies(BOTH, faults={2: 1, 3: 1}).code == 0
            wait_until(lambda: record(node0).state == "REJOINING", 10, "the round to wait for a replacement")
            assert list(record(node0).rejoining) == [1]
            # the old agent comes back: fenced
            refused = node1.register()
            assert refused.code == 411 and "declared lost" in refused.info
            node1.subscribe()
            fenced = node1.expect("taskd.fenced")
            assert "awaits a replacement" in json.loads(fenced.extraParams)["reason"]
            old.register_action_handler("taskd.fenced", fenced_seen.append)
            subscriber = threading.Thread(target=old.start_subscribe, daemon=True)
            subscriber.start()
            subscriber.join(20)
            assert not subscriber.is_alive(), "the real client kept resubscribing after it was fenced"
            assert len(fenced_seen) == 1 and "declared lost" in json.loads(fenced_seen[0].extra_params)["reason"]
            with pytest.raises(FencedError, match="declared lost"):
                old.report_stop_complete(0, "", {2: 1})
            # the replacement
            assert new1.init().code == 0
            reg = new1.register()
            assert reg.code == 0 and "replacement of node 1" in reg.info
            new1.subscribe()
            for agent in (node0, new1):
                change = agent.expect("changeStrategy", "recover")
                assert sorted(int(f.rankId) for f in change.faultRanks) == [2, 3]
                assert json.loads(change.extraParams)["restarts"] == 1
            assert node0.status("recover").code == 0 and new1.status("recover").code == 0
            rec = record(node0)
            assert rec.state == "RUNNING" and list(rec.rejoining) == [] and rec.restarts == 1
            (loss,) = rec.rounds[-1].nodeLosses
            assert (loss.nodeRank, loss.oldHost, loss.newHost, loss.newPid) == (1, "b", "c", 4242)
            assert 0 < loss.secondsToRoundEnd < 30 and loss.replacedAt >= loss.lostAt > 0
            text = render_text(node0.list_jobs(job))
            assert "node 1 lost (agent b:" in text and "replaced by c:4242" in text and "lost -> round ended" in text
            assert node1.finished(0).code == 411  # the fenced agent's finish counts for nothing
        finally:
            old.stop()
            for a in (node0, node1, new1):
                a.close()


def test_no_replacement_fails_the_job_with_how_to_add_a_node() -> None:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2,
                           agent_loss_timeout=LOSS, agent_loss_grace=0.5, node_rejoin_timeout=1.5)
    job = f"loss-{next(_ids)}"
    with EmbeddedController(cfg) as ctl:
        node0 = ScriptedAgent(ctl.address, job, node_rank=0, node_count=2, ranks_per_node=1).join()
        node1 = ScriptedAgent(ctl.address, job, node_rank=1, node_count=2, ranks_per_node=1).join()
        try:
            node1.unsubscribe()
            node0.expect("stopTrain", timeout=LOSS + 10)
            node0.stop_complete(faults={1: 1})
            node0.expect("globalFault")
            node0.strategies(BOTH, faults={1: 1})
            exit_ = node0.expect("changeStrategy", "exit", timeout=20)
            reason = json.loads(exit_.extraParams)["reason"]
            assert "taskd run --node-rank 1" in reason and "--standby" in reason
            assert record(node0).state == "FAILED"
        finally:
            node0.close()
            node1.close()
