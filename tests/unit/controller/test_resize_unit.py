"""Issue 17 item 4, the controller's scale-in (downgrade) and scale-out (upgrade) as a pure state machine."""

from __future__ import annotations

import json
from functools import partial

import pytest
from support.controller import ROUND_CFG, fire, running_job

from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    JobMachine,
    JobState,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.nodes import resize
from taskd.controller.service.hub import extra_params
from taskd.controller.storage.snapshot import restore_into, snapshot
from taskd.vocabulary import SignalType

S = JobState
ELASTIC = ("retry", "recover", "job-rescheduling", "exit", "downgrade", "upgrade")
FIXED = ("recover", "job-rescheduling", "exit")


job = partial(running_job, nodes=3, per_node=2, min_nodes=2)


def lose(m: JobMachine, node: int, offers: dict[int, tuple[str, ...]], t: float = 5.0) -> None:
    """Node `node`'s taskd run is killed; the survivors answer the round with `offers`; REJOINING."""
    m.handle(AgentDisconnected(node_rank=node), t)
    fire(m, t + 5.0)
    for n in offers:
        m.handle(StopComplete(node_rank=n, host="h", pid=100 + n), t + 6.0)
    for n, offered in offers.items():
        m.handle(StrategiesReported(node_rank=n, strategies=offered, host="h", pid=100 + n), t + 7.0)
    assert m.state == S.REJOINING


def recovered(m: JobMachine, nodes: dict[int, tuple[str, int]], strategy: str, t: float) -> None:
    for n, (host, pid) in nodes.items():
        m.handle(RecoverStatusReported(node_rank=n, host=host, pid=pid, strategy=strategy), t)
    assert m.state == S.RUNNING


def test_rank_map_is_contiguous_in_node_then_local_rank_order() -> None:
    m = job(nodes=4, per_node=2)
    assert resize.rank_map(m, {1}) == {0: 0, 1: 1, 4: 2, 5: 3, 6: 4, 7: 5}
    assert resize.rank_map(m, {0, 3}) == {2: 0, 3: 1, 4: 2, 5: 3}
    assert resize.rank_map(m, set()) == {r: r for r in range(8)}


def test_no_replacement_in_time_scales_in_then_a_new_node_grows_the_job_back() -> None:
    m = job()
    lose(m, 2, {0: ELASTIC, 1: ELASTIC})
    assert fire(m, 109.9) == [] and m.state == S.REJOINING
    (out,) = fire(m, 110.0)  # the rejoin timeout: 100 s after the loss
    assert m.state == S.RECOVERING and m.absent == {2: 110.0} and m.rejoining == {}
    (change,) = out.signals
    assert change.signal_type == SignalType.CHANGE_STRATEGY and change.strategy == "downgrade"
    assert dict(change.faults) == {4: "1", 5: "1"}
    params = json.loads(extra_params(change))
    assert params == {"generation": change.generation, "restarts": 1, "round": 1, "world_size": 4,
                      "rank_map": {"0": 0, "1": 1, "2": 2, "3": 3}}
    (resized,) = [r for r in out.records if r.kind == "resized"]
    assert resized.detail["world_size"] == 4 and resized.detail["node_count"] == 2
    assert m.round.participants == {0, 1} and m.restarts == 1  # the node-loss round's one restart
    recovered(m, {0: ("h", 100), 1: ("h", 101)}, "downgrade", 111.0)
    assert "2 of 3 node(s), world size 4" in m.info or m.info.startswith("round 1 ended with downgrade")
    assert m.expected_nodes() == {0, 1}
    # node 2 comes back (`taskd run --node-rank 2` on a new host): its Register is the hand-over
    out = m.handle(AgentRegistered(node_rank=2, host="h3", pid=300, ranks_per_node=2), 120.0)
    assert out.code == 0 and "replacement of node 2" in out.info and m.state == S.RUNNING
    out = m.handle(AgentConnected(node_rank=2, host="h3", pid=300), 121.0)
    assert m.state == S.RECOVERING and m.absent == {}
    (change,) = out.signals
    assert change.strategy == "upgrade" and dict(change.faults) == {4: "1", 5: "1"}
    params = json.loads(extra_params(change))
    assert params["world_size"] == 6 and params["rank_map"] == {str(r): r for r in range(6)}
    assert params["generation"] > 0 and m.round.participants == {0, 1, 2}
    assert m.restarts == 1  # growing back restarts nothing
    recovered(m, {0: ("h", 100), 1: ("h", 101), 2: ("h3", 300)}, "upgrade", 122.0)
    for n, pid in ((0, 100), (1, 101), (2, 300)):
        m.handle(AgentFinished(node_rank=n, exit_code=0, host="h3" if n == 2 else "h", pid=pid), 130.0)
    assert m.state == S.SUCCEEDED


def test_a_scaled_in_job_succeeds_when_its_present_nodes_finish() -> None:
    m = job()
    lose(m, 1, {0: ELASTIC, 2: ELASTIC})
    fire(m, 110.0)
    recovered(m, {0: ("h", 100), 2: ("h", 102)}, "downgrade", 111.0)
    m.handle(AgentFinished(node_rank=0, exit_code=0, host="h", pid=100), 120.0)
    assert m.state == S.RUNNING
    m.handle(AgentFinished(node_rank=2, exit_code=0, host="h", pid=102), 121.0)
    assert m.state == S.SUCCEEDED


@pytest.mark.parametrize(("nodes", "min_nodes", "lost", "offered", "why"), [
    (3, 0, (2,), ELASTIC, ""),
    (3, 3, (2,), ELASTIC, "the job is fixed-size (run every node with `taskd run --nnodes MIN:MAX`"),
    (4, 3, (2, 3), ELASTIC, "only 2 node(s) would remain, fewer than --nnodes MIN 3"),
    (3, 2, (2,), FIXED, "node(s) 0, 1 did not offer downgrade"),
], ids=["fixed-size", "min-is-max", "below-min", "not-offered"])
def test_without_the_opt_in_the_rejoin_timeout_fails_the_job_saying_how_to_add_a_node(
        nodes: int, min_nodes: int, lost: tuple[int, ...], offered: tuple[str, ...], why: str) -> None:
    m = job(nodes=nodes, min_nodes=min_nodes)
    for n in lost:
        m.handle(AgentDisconnected(node_rank=n), 5.0)
    fire(m, 10.0)
    survivors = [n for n in range(nodes) if n not in lost]
    for n in survivors:
        m.handle(StopComplete(node_rank=n, host="h", pid=100 + n), 11.0)
    for n in survivors:
        m.handle(StrategiesReported(node_rank=n, strategies=offered, host="h", pid=100 + n), 12.0)
    assert m.state == S.REJOINING
    (out,) = fire(m, 110.0)
    assert m.state == S.FAILED and m.absent == {}
    (exit_,) = out.signals
    info = json.loads(extra_params(exit_))["reason"]
    assert exit_.strategy == "exit" and "taskd run --standby" in info
    assert all(f"start `taskd run --node-rank {n} ...`" in info for n in lost), info
    assert "within 100 s (--node-rejoin-timeout)" in info
    if why:
        assert f"could not go on without {'it' if len(lost) == 1 else 'them'}: {why}" in info, info
    else:
        assert "could not go on" not in info  # a job that never opted in is only told how to add a node


def test_a_scaled_in_job_survives_a_controller_restart() -> None:
    m = job()
    lose(m, 2, {0: ELASTIC, 1: ELASTIC})
    fire(m, 110.0)
    recovered(m, {0: ("h", 100), 1: ("h", 101)}, "downgrade", 111.0)
    snap = json.loads(json.dumps(snapshot(m)))
    fresh = JobMachine("j", ROUND_CFG, 0.0)
    restore_into(fresh, snap, list(m.agents.values()), 200.0)
    assert fresh.absent == {2: 110.0} and fresh.min_nodes == 2 and fresh.expected_nodes() == {0, 1}


def test_a_standby_that_comes_while_the_job_is_scaled_in_takes_the_absent_node_and_grows_it_back() -> None:
    from taskd.controller.machine.events import StandbyConnected

    m = job()
    lose(m, 1, {0: ELASTIC, 2: ELASTIC})
    fire(m, 110.0)
    recovered(m, {0: ("h", 100), 2: ("h", 102)}, "downgrade", 111.0)
    assert m.handle(AgentRegistered(node_rank=0, host="s", pid=900, standby=True), 120.0).code == 0
    out = m.handle(StandbyConnected(host="s", pid=900), 120.0)
    (sig,) = out.direct  # its own stream: assigned the absent node at once
    assert sig.signal_type == SignalType.ASSIGN_NODE and json.loads(extra_params(sig))["node_rank"] == 1
    out = m.handle(AgentRegistered(node_rank=1, host="s", pid=900, ranks_per_node=2), 121.0)
    assert out.code == 0 and "replacement of node 1" in out.info and m.standbys == {}
    out = m.handle(AgentConnected(node_rank=1, host="s", pid=900), 122.0)
    (change,) = out.signals
    assert change.strategy == "upgrade" and dict(change.faults) == {2: "1", 3: "1"} and m.absent == {}


def test_a_node_that_comes_back_during_another_round_grows_the_job_once_that_round_closes() -> None:
    from taskd.controller.machine.state_machine import FaultReported

    m = job()
    lose(m, 1, {0: ELASTIC, 2: ELASTIC})
    fire(m, 110.0)
    recovered(m, {0: ("h", 100), 2: ("h", 102)}, "downgrade", 111.0)
    m.handle(FaultReported(node_rank=0, faults={1: "1"}, host="h", pid=100), 120.0)  # a rank of node 0 crashes
    for n in (0, 2):
        m.handle(StopComplete(node_rank=n, host="h", pid=100 + n), 121.0)
    m.handle(AgentRegistered(node_rank=1, host="h3", pid=300, ranks_per_node=2), 121.5)
    assert m.handle(AgentConnected(node_rank=1, host="h3", pid=300), 121.6).signals == []  # not in that round
    for n in (0, 2):
        m.handle(StrategiesReported(node_rank=n, strategies=ELASTIC, host="h", pid=100 + n), 122.0)
    assert m.state == S.RECOVERING and m.round.strategy == "recover" and m.round.participants == {0, 2}
    m.handle(RecoverStatusReported(node_rank=0, host="h", pid=100, strategy="recover"), 123.0)
    out = m.handle(RecoverStatusReported(node_rank=2, host="h", pid=102, strategy="recover"), 123.0)
    assert m.state == S.RECOVERING and m.absent == {}
    (change,) = out.signals
    assert change.strategy == "upgrade" and json.loads(extra_params(change))["world_size"] == 6


def test_min_nodes_is_checked_where_the_init_and_the_agent_config_are_built() -> None:
    from taskd.agent.config import AgentConfig
    from taskd.controller.service.validation import check_client
    from taskd.proto import recover_pb2

    def info(min_nodes: int, nodes: int = 3) -> recover_pb2.ClientInfo:
        return recover_pb2.ClientInfo(jobId="j", nodeCount=nodes, ranksPerNode=2, minNodes=min_nodes)

    assert check_client(info(0)) == "" and check_client(info(2)) == "" and check_client(info(3)) == ""
    assert "minNodes 4 must be 0 (a fixed-size job) or in [1, nodeCount 3]" in check_client(info(4))
    assert "minNodes -1" in check_client(info(-1))
    assert AgentConfig(launcher="taskd", node_count=3, min_nodes=2).scales
    assert not AgentConfig(launcher="taskd", node_count=3, min_nodes=3).scales
    assert not AgentConfig(launcher="taskd", node_count=3).scales
    with pytest.raises(ValueError, match=r"min_nodes \(--nnodes MIN:MAX\) 4 is above the job's 3 node"):
        AgentConfig(launcher="taskd", node_count=3, min_nodes=4, origins={"min_nodes": "--nnodes MIN:MAX"}).validate()
