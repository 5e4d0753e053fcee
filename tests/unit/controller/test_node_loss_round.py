"""Issue 17, the controller's node-loss round as a pure state machine (events in, states and signals out)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from support.controller import ROUND_CFG, fire, running_job

from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentRegistered,
    FaultReported,
    JobInit,
    JobMachine,
    JobState,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.service.hub import extra_params
from taskd.vocabulary import Code, SignalType

S = JobState
BOTH = ("recover", "job-rescheduling", "dump", "exit")


job = partial(running_job, per_node=2)


def kinds(outs: list[Any]) -> list[str]:
    return [r.kind for o in outs for r in o.records]


def signals(outs: list[Any]) -> list[Any]:
    return [s for o in outs for s in o.signals]


def lose_node_1(m: JobMachine) -> list[Any]:
    m.handle(AgentDisconnected(node_rank=1), 5.0)  # its taskd run was SIGKILLed: the stream ended
    assert fire(m, 9.9) == [] or m.state == S.RUNNING
    return fire(m, 10.0)  # the grace (5 s), not the loss timeout (30 s)


def test_a_lost_node_opens_a_round_for_its_ranks_and_its_replacement_is_recovered_live() -> None:
    m = job()
    outs = lose_node_1(m)
    assert m.state == S.STOPPING and m.rejoining == {1: 10.0}
    (stop,) = signals(outs)
    assert stop.signal_type == SignalType.STOP_TRAIN and dict(stop.faults) == {2: "1", 3: "1"} and stop.nodes == (1,)
    assert json.loads(extra_params(stop))["fault_ago"] == 5.0  # the survivors time their recovery from the fault
    (lost,) = [r for o in outs for r in o.records if r.kind == "node_lost"]
    assert lost.detail["node_rank"] == 1 and lost.detail["host"] == "h" and lost.detail["pid"] == 101
    assert "agent_lost" not in kinds(outs) and "job_failed" not in kinds(outs)
    assert m.round is not None and m.round.participants == {0}  # the lost agent is not waited for
    # the survivor answers as for any remote fault
    out = m.handle(StopComplete(node_rank=0, host="h", pid=100, faults={2: "1", 3: "1"}), 11.0)
    assert m.state == S.COLLECTING and [s.signal_type for s in out.signals] == [SignalType.GLOBAL_FAULT]
    out = m.handle(StrategiesReported(node_rank=0, strategies=BOTH, host="h", pid=100), 12.0)
    assert m.state == S.REJOINING and out.signals == [] and "rejoin_waiting" in [r.kind for r in out.records]
    assert m.deadline is None and m.wake_at == 110.0  # the rejoin timeout, counted from the loss
    # the lost agent comes back (SIGCONT): fenced, whatever it sends
    for ev in (AgentRegistered(node_rank=1, host="h", pid=101), JobInit(node_count=2, node_rank=1, host="h", pid=101),
               RecoverStatusReported(node_rank=1, host="h", pid=101, strategy="recover")):
        refused = m.handle(ev, 13.0)
        assert refused.code == Code.FENCED and "declared lost" in refused.info
        assert "awaits a replacement" in refused.info
    # a replacement on another host registers: the hand-over; it must not start ranks on its own
    out = m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2), 14.0)
    assert out.code == 0 and "replacement of node 1" in out.info and m.state == S.REJOINING
    (replaced,) = [r for r in out.records if r.kind == "node_replaced"]
    assert replaced.detail == {"node_rank": 1, "old_host": "h", "old_pid": 101, "host": "h2", "pid": 201,
                               "standby": False}
    assert m.rejoining == {1: 10.0}  # registered, not subscribed yet
    refused = m.handle(StopComplete(node_rank=1, host="h", pid=101), 14.5)
    assert refused.code == Code.FENCED and "is now held by h2:201" in refused.info
    # it subscribes: the round decides, every agent (the replacement included) gets changeStrategy
    out = m.handle(AgentConnected(node_rank=1, host="h2", pid=201), 15.0)
    assert m.state == S.RECOVERING and m.rejoining == {}
    (change,) = out.signals
    assert change.signal_type == SignalType.CHANGE_STRATEGY and change.strategy == "recover"
    assert dict(change.faults) == {2: "1", 3: "1"}
    assert json.loads(extra_params(change)) == {"generation": change.generation, "restarts": 1, "round": 1}
    assert m.round.participants == {0, 1} and m.restarts == 1
    m.handle(RecoverStatusReported(node_rank=0, host="h", pid=100, strategy="recover"), 16.0)
    assert m.state == S.RECOVERING
    out = m.handle(RecoverStatusReported(node_rank=1, host="h2", pid=201, strategy="recover"), 17.0)
    assert m.state == S.RUNNING and m.restarts == 1
    (ended,) = [r for r in out.records if r.kind == "round_ended"]
    # counted from the fault (the stream's end at 5.0), not from the declaration a grace later (issue 32, F6)
    assert ended.detail["outcome"] == "recovered" and ended.detail["since_loss"] == {"1": 12.0}
    assert m.agents[1].host == "h2" and m.agents.problems() == []


def test_without_every_survivors_offer_of_recover_the_round_takes_job_rescheduling() -> None:
    m = job(nodes=3, per_node=1)
    m.handle(AgentDisconnected(node_rank=2), 5.0)
    fire(m, 10.0)
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 12.0)
    m.handle(StrategiesReported(node_rank=1, strategies=("job-rescheduling", "exit")), 12.0)
    m.handle(AgentRegistered(node_rank=2, host="h3", pid=7, ranks_per_node=1), 13.0)
    out = m.handle(AgentConnected(node_rank=2, host="h3", pid=7), 13.0)
    assert [s.strategy for s in out.signals] == ["job-rescheduling"] and m.restarts == 1


def test_a_replacement_before_the_survivors_answered_is_decided_on_their_last_answer() -> None:
    m = job()
    lose_node_1(m)
    m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2), 10.5)
    m.handle(AgentConnected(node_rank=1, host="h2", pid=201), 10.6)
    assert m.state == S.STOPPING and m.rejoining == {}
    m.handle(StopComplete(node_rank=0), 11.0)
    out = m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 12.0)
    assert m.state == S.RECOVERING and [s.strategy for s in out.signals] == ["recover"]


def test_no_replacement_in_time_fails_the_job_saying_how_to_add_a_node() -> None:
    m = job()
    lose_node_1(m)
    m.handle(StopComplete(node_rank=0), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 12.0)
    assert fire(m, 109.9) == [] and m.state == S.REJOINING
    outs = fire(m, 110.0)
    assert m.state == S.FAILED and "rejoin_timeout" in kinds(outs)
    (exit_,) = signals(outs)
    assert exit_.strategy == "exit"
    reason = json.loads(extra_params(exit_))["reason"]
    assert "no replacement joined within 100 s" in reason and "taskd run --node-rank 1" in reason
    assert "taskd run --standby" in reason


def test_a_new_process_cannot_take_a_node_whose_agent_is_not_yet_declared_lost() -> None:
    m = job()
    m.handle(AgentDisconnected(node_rank=1), 5.0)
    out = m.handle(AgentRegistered(node_rank=1, host="h2", pid=201), 6.0)
    assert out.code == Code.INVALID_PARAMS and "declared lost in 4.0s" in out.info
    assert m.agents[1].pid == 101 and m.state == S.RUNNING


def test_a_stream_that_ended_has_the_grace_a_silent_agent_the_loss_timeout() -> None:
    m = job()
    m.handle(AgentRegistered(node_rank=1, host="h", pid=101, ranks_per_node=2), 1.0)  # re-register, no stream
    m.handle(AgentDisconnected(node_rank=1), 1.0)  # (already without its stream)
    m2 = JobMachine("j2", ROUND_CFG, 0.0, JobInit(node_count=2, ranks_per_node=1))
    m2.handle(AgentRegistered(node_rank=0, host="h", pid=1, ranks_per_node=1), 0.0)
    m2.handle(AgentConnected(node_rank=0), 0.0)
    m2.handle(AgentRegistered(node_rank=1, host="h", pid=2, ranks_per_node=1), 2.0)  # never subscribes
    assert m2.wake_at == 32.0
    assert fire(m2, 31.9) == [] and m2.state == S.RUNNING
    fire(m2, 32.0)
    assert m2.state == S.STOPPING and m2.rejoining == {1: 32.0}


def test_a_round_open_when_a_node_is_lost_takes_its_ranks_and_charges_one_restart() -> None:
    m = job()
    m.handle(FaultReported(node_rank=0, faults={0: "1"}), 1.0)  # a rank of node 0 died: round 1
    m.handle(StopComplete(node_rank=0), 2.0)
    m.handle(StopComplete(node_rank=1), 2.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 3.0)
    m.handle(StrategiesReported(node_rank=1, strategies=BOTH), 3.0)
    assert m.state == S.RECOVERING and m.restarts == 1
    m.handle(AgentDisconnected(node_rank=1), 4.0)  # node 1 dies while recovering
    outs = fire(m, 9.0)
    assert m.state == S.STOPPING and m.round.number == 1 and dict(signals(outs)[0].faults) == {0: "1", 2: "1", 3: "1"}
    m.handle(StopComplete(node_rank=0), 10.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 10.0)
    m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2), 11.0)
    out = m.handle(AgentConnected(node_rank=1, host="h2", pid=201), 11.0)
    assert [s.strategy for s in out.signals] == ["recover"] and m.restarts == 1  # the round paid once
    # a failed recover escalates to job-rescheduling across every node, still one restart
    out = m.handle(RecoverStatusReported(node_rank=1, code=Code.OUT_OF_ORDER, info="boom", strategy="recover"), 12.0)
    assert [s.strategy for s in out.signals] == ["job-rescheduling"] and m.restarts == 1


def test_a_restart_mid_round_keeps_the_awaited_node_and_the_fence() -> None:
    m = job()
    lose_node_1(m)
    m.handle(StopComplete(node_rank=0), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH), 12.0)
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), ROUND_CFG, 20.0)
    assert r.state == S.RESUMING and r.rejoining == {1: 10.0} and r.round.lost == {1: 5.0}
    assert r.handle(AgentRegistered(node_rank=1, host="h", pid=101), 21.0).code == Code.FENCED
    out = r.handle(AgentConnected(node_rank=0, host="h", pid=100), 21.0)  # every agent not awaited is back
    assert r.state == S.STOPPING and [s.signal_type for s in out.signals] == [SignalType.STOP_TRAIN]
    r.handle(StopComplete(node_rank=0), 22.0)
    r.handle(StrategiesReported(node_rank=0, strategies=BOTH), 22.0)
    assert r.state == S.REJOINING and r.wake_at == 110.0


def test_a_job_all_of_whose_agents_were_lost_is_restarted_by_its_replacement() -> None:
    m = job(nodes=1, per_node=2)
    m.handle(AgentDisconnected(node_rank=0), 1.0)
    fire(m, 6.0)
    assert m.state == S.REJOINING and m.rejoining == {0: 6.0}
    m.handle(AgentRegistered(node_rank=0, host="h2", pid=9, ranks_per_node=2), 7.0)
    out = m.handle(AgentConnected(node_rank=0, host="h2", pid=9), 7.0)
    assert m.state == S.RECOVERING and [s.strategy for s in out.signals] == ["recover"]
    m.handle(RecoverStatusReported(node_rank=0, strategy="recover"), 8.0)
    assert m.state == S.RUNNING


def test_a_replacement_whose_init_comes_while_no_survivor_is_connected_joins_the_round_and_resets_nothing() -> None:
    """Found by bench/chaos.py: the controller restarted during a node-loss round, and the replacement's Init
    arrived before the survivor resubscribed; it reset the job ("no agent of the job is connected"), the
    round was abandoned and its restart never charged."""
    m = job()
    lose_node_1(m)
    m.handle(StopComplete(node_rank=0, host="h", pid=100, faults={2: "1", 3: "1"}), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=BOTH, host="h", pid=100), 12.0)
    assert m.state == S.REJOINING
    m.handle(AgentDisconnected(node_rank=0), 13.0)  # the survivor's stream is down for a moment
    assert m.agents.online_count == 0
    out = m.handle(JobInit(node_count=2, ranks_per_node=2, node_rank=1, host="h2", pid=201), 13.5)
    assert out.code == 0 and "job_reset" not in [r.kind for r in out.records], out
    assert m.state == S.REJOINING and m.rejoining == {1: 10.0} and m.round is not None and m.round.number == 1
    out = m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2), 14.0)
    assert out.code == 0 and "replacement of node 1" in out.info
