"""Issue 17, standby agents over real gRPC (127.0.0.1, port 0, scripted agents on raw stubs): a standby is
registered and listed, takes a lost node (longest waiting first, the next loss the next standby), hands over by
registering as that node, is dropped when it goes, is bounded, survives a controller restart, and is told to
exit when the job ends."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

from support.scripted_agent import ScriptedAgent, StreamEnded

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.status_view import render_text
from taskd.launcher.spec import free_port

_ids = itertools.count()
FAST = {"keepalive_interval": 0.2, "agent_loss_timeout": 2.0, "agent_loss_grace": 0.3, "node_rejoin_timeout": 30}
BOTH = ["recover", "job-rescheduling", "dump", "exit"]


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def standby(address: str, job: str, pid: int, nodes: int = 3) -> ScriptedAgent:
    agent = ScriptedAgent(address, job, node_rank=0, node_count=nodes, host="spare", pid=pid)
    agent.info.standby = True
    return agent


def until(agent: ScriptedAgent, signal_type: str, timeout: float = 10) -> object:
    """The next `signal_type` signal, skipping the round's others (a widened round sends stopTrain again)."""
    deadline = time.monotonic() + timeout
    while True:
        sig = agent.next_signal(max(deadline - time.monotonic(), 0.01))
        if sig.signalType == signal_type:
            return sig


def standbys(agent: ScriptedAgent) -> list[tuple[str, int, bool]]:
    (rec,) = agent.list_jobs(agent.job_id).jobs
    return [(a.host, a.pid, a.subscribed) for a in rec.agents if a.standby]


def test_standbys_take_lost_nodes_longest_waiting_first_and_hand_over_by_registering() -> None:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", **FAST)
    job = f"sb-{next(_ids)}"
    with EmbeddedController(cfg) as ctl:
        nodes = [ScriptedAgent(ctl.address, job, node_rank=n, node_count=3, host=f"n{n}").join() for n in range(3)]
        first, second = standby(ctl.address, job, 7001), standby(ctl.address, job, 7002)
        try:
            first.join()
            second.join()
            wait_until(lambda: standbys(first) == [("spare", 7001, True), ("spare", 7002, True)], 5, "both listed")
            (rec,) = first.list_jobs(job).jobs
            assert rec.nodeCount == 3 and sorted(a.nodeRank for a in rec.agents if not a.standby) == [0, 1, 2]
            assert "standbys: spare:7001 waiting since" in render_text(first.list_jobs(job))
            nodes[1].unsubscribe()  # node 1's agent is gone
            sig = first.expect("taskd.assignNode", timeout=10)
            assert list(sig.nodeRankIds) == ["1"] and json.loads(sig.extraParams) == {"node_rank": 1}
            second.no_signal(0.3)  # the one that waited longest takes it, only it
            nodes[2].unsubscribe()  # a second loss takes the next standby
            sig = second.expect("taskd.assignNode", timeout=10)
            assert json.loads(sig.extraParams) == {"node_rank": 2}
            # the standby registers as node 1 (same process): the hand-over; its standby stream ends
            first.info.standby, first.info.nodeRank = False, 1
            reg = first.register()
            assert reg.code == 0 and "replacement of node 1" in reg.info
            try:
                first.next_signal(5)
                raise AssertionError("the standby stream went on after the standby became node 1")
            except StreamEnded:
                pass
            first.subscribe()  # as node 1 now
            (rec,) = first.list_jobs(job).jobs
            assert [a.pid for a in rec.agents if a.nodeRank == 1 and not a.standby] == [7001]
            assert [a.pid for a in rec.agents if a.standby] == [7002]
            node0 = nodes[0]
            until(node0, "stopTrain")
            assert node0.stop_complete(faults={1: 1, 2: 1}).code == 0
            until(node0, "globalFault")
            assert node0.strategies(BOTH).code == 0
            second.info.standby, second.info.nodeRank = False, 2
            assert second.register().code == 0
            second.subscribe()
            for agent in (node0, first, second):
                change = until(agent, "changeStrategy")
                assert change.changeStrategy == "recover"
                assert sorted(int(f.rankId) for f in change.faultRanks) == [1, 2]
            (loss1, loss2) = sorted(first.list_jobs(job).jobs[0].rounds[-1].nodeLosses, key=lambda x: x.nodeRank)
            assert loss1.standby and loss1.newPid == 7001 and loss2.standby and loss2.newPid == 7002
        finally:
            for a in (*nodes, first, second):
                a.close()


def test_a_standby_that_goes_or_never_subscribes_is_dropped_and_more_than_the_bound_are_refused() -> None:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", max_standbys=1, **FAST)
    job = f"sb-{next(_ids)}"
    with EmbeddedController(cfg) as ctl:
        node0 = ScriptedAgent(ctl.address, job, node_rank=0, node_count=2).join()
        node1 = ScriptedAgent(ctl.address, job, node_rank=1, node_count=2).join()
        spare, extra = standby(ctl.address, job, 7101, 2), standby(ctl.address, job, 7102, 2)
        try:
            spare.join()
            assert extra.init().code == 0
            refused = extra.register()
            assert refused.code == 409 and "--max-standbys" in refused.info
            spare.close()  # the spare goes away: forgotten, no loss round, no node lost
            wait_until(lambda: standbys(node0) == [], 5, "the standby to be dropped")
            node0.no_signal(0.5)
            (rec,) = node0.list_jobs(job).jobs
            assert rec.state == "RUNNING" and "node_lost" not in [e.kind for e in rec.events]
            assert extra.register().code == 0  # its place is free again
            # ... and it never opens its stream: dropped after the agent loss timeout (2 s), as an agent would be
            assert standbys(node0) == [("spare", 7102, False)]
            wait_until(lambda: standbys(node0) == [], 6, "the standby without a stream to be dropped")
            (rec,) = node0.list_jobs(job).jobs
            dropped = [json.loads(e.detail) for e in rec.events if e.kind == "standby_dropped"]
            assert dropped[-1]["pid"] == 7102 and "no signal stream for" in dropped[-1]["reason"], dropped
            assert rec.state == "RUNNING"
        finally:
            for a in (node0, node1, spare, extra):
                a.close()


def test_standbys_survive_a_controller_restart_and_the_jobs_end_releases_them(tmp_path: Path) -> None:
    cfg = ControllerConfig(listen=f"127.0.0.1:{free_port()}", state_path=str(tmp_path / "ctl.sqlite3"), **FAST)
    job = f"sb-{next(_ids)}"
    ctl = EmbeddedController(cfg)
    ctl.start()
    second: EmbeddedController | None = None
    node0 = ScriptedAgent(ctl.address, job, node_rank=0, node_count=1)
    spare = standby(ctl.address, job, 7201, 1)
    try:
        spare.join()  # before the job's own node: the standby's Init creates the job, the node's Init resets it
        node0.join()
        assert standbys(node0) == [("spare", 7201, True)]
        ctl.stop()
        second = EmbeddedController(cfg)
        second.start()
        node0.subscribe()  # back within the loss timeout: no node lost
        assert standbys(node0) == [("spare", 7201, False)]  # restored from the state file, its stream not back yet
        spare.subscribe()
        wait_until(lambda: standbys(node0) == [("spare", 7201, True)], 10, "the standby back")
        assert node0.finished(0).code == 0
        end = spare.expect("changeStrategy", "exit", timeout=10)
        assert "job ended" in json.loads(end.extraParams)["reason"]
        (rec,) = node0.list_jobs(job).jobs
        assert rec.state == "SUCCEEDED" and [a for a in rec.agents if a.standby] == []
    finally:
        node0.close()
        spare.close()
        if second is not None:
            second.stop()
        ctl.stop()
