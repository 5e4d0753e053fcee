"""Issue 31, F2: what a controller restart does to a round, per round state (pure: snapshot, restore, events).

A round whose strategy was chosen (RECOVERING) resumes where it was: the statuses counted stay counted, the agents
that still owe one get the very changeStrategy again (its uuid and live generation, so an agent that carries it out
already does not redo it), and nothing is charged or chosen again. An undecided round (STOPPING, COLLECTING,
REJOINING, or RESUMING again after a second restart) is re-run once: stopTrain when every agent is back.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.controller import ROUND_CFG, running_job

from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentRegistered,
    FaultReported,
    JobMachine,
    JobState,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
    Tick,
)
from taskd.controller.service.hub import extra_params

S = JobState
OFFERED = ("recover", "job-rescheduling", "exit")


def to(m: JobMachine, state: S) -> list[Any]:
    """Rank 1 crashed; the round taken as far as `state`; the signals of its last step."""
    out = m.handle(FaultReported(node_rank=1, faults={1: "1"}), 1.0)
    if state == S.STOPPING:
        m.handle(StopComplete(node_rank=0), 1.1)
        return out.signals
    for n in (0, 1):
        out = m.handle(StopComplete(node_rank=n), 1.1)
    if state == S.COLLECTING:
        m.handle(StrategiesReported(node_rank=0, strategies=OFFERED), 1.2)
        return out.signals
    for n in (0, 1):
        out = m.handle(StrategiesReported(node_rank=n, strategies=OFFERED), 1.2)
    assert m.state == state
    return out.signals


def restart(m: JobMachine, now: float) -> tuple[JobMachine, Any]:
    """SIGKILL and restart: the snapshot as the store keeps it (JSON), the agents offline."""
    snap = json.loads(json.dumps(m.snapshot()))
    return JobMachine.restore(snap, [a.copy() for a in m.agents.values()], ROUND_CFG, now)


def back(m: JobMachine, now: float, nodes: tuple[int, ...] = (0, 1)) -> dict[int, list[Any]]:
    """The agents resubscribe; what each got on its own stream, and what went to every agent."""
    got = {}
    for n in nodes:
        out = m.handle(AgentConnected(node_rank=n, host="h", pid=100 + n), now)
        got[n] = out.direct
        got.setdefault(-1, []).extend(out.signals)
    return got


@pytest.mark.parametrize("reported", [(), (0,), (1,)])
def test_recovering_resumes_where_it_was(reported: tuple[int, ...]) -> None:
    m = running_job()
    (change,) = to(m, S.RECOVERING)
    for n in reported:
        m.handle(RecoverStatusReported(node_rank=n, strategy="recover"), 2.0)
    r, out = restart(m, 40.0)
    assert r.state == S.RECOVERING and r.round.strategy == "recover" and r.round.statuses == set(reported)
    assert r.deadline == 40.0 + ROUND_CFG.recover_timeout  # a whole recover timeout from the restart
    (restored,) = [x for x in out.records if x.kind == "round_restored"]
    assert restored.detail["awaiting"] == sorted({0, 1} - set(reported))
    got = back(r, 41.0)
    assert got.pop(-1) == []  # nothing broadcast: no stopTrain, no new decision
    for n in (0, 1):  # the very changeStrategy again (uuid, generation), to the agents that owe its status only
        assert got[n] == ([] if n in reported else [change]), n
    for n in (0, 1):
        if n not in reported:
            assert r.handle(RecoverStatusReported(node_rank=n, strategy="recover"), 42.0).code == 0
    assert r.state == S.RUNNING and r.restarts == 1 and r.round is None
    assert json.loads(extra_params(change))["generation"] == change.generation  # the live generation, unchanged


def test_a_status_sent_before_its_agent_resubscribed_counts() -> None:
    """The agent's outbox re-sends its pending status as soon as it re-registered, before its stream is back."""
    m = running_job()
    to(m, S.RECOVERING)
    r, _ = restart(m, 40.0)
    assert r.handle(AgentRegistered(node_rank=0, host="h", pid=100, ranks_per_node=1), 40.5).code == 0
    assert r.handle(RecoverStatusReported(node_rank=0, strategy="recover"), 40.6).code == 0
    got = back(r, 41.0)
    assert got[0] == [] and [s.strategy for s in got[1]] == ["recover"]
    r.handle(RecoverStatusReported(node_rank=1, strategy="recover"), 42.0)
    assert r.state == S.RUNNING and r.restarts == 1


def test_a_second_restart_still_resumes_in_place_and_charges_once() -> None:
    m = running_job()
    (change,) = to(m, S.RECOVERING)
    r, _ = restart(m, 40.0)
    back(r, 41.0)
    r.handle(RecoverStatusReported(node_rank=0, strategy="recover"), 42.0)
    r2, _ = restart(r, 60.0)
    assert r2.state == S.RECOVERING and r2.round.statuses == {0}
    assert back(r2, 61.0)[1] == [change]
    r2.handle(RecoverStatusReported(node_rank=1, strategy="recover"), 62.0)
    assert r2.state == S.RUNNING and r2.restarts == 1


def test_a_restored_recovering_round_still_times_out_to_the_next_strategy() -> None:
    m = running_job()
    to(m, S.RECOVERING)
    r, _ = restart(m, 40.0)
    back(r, 41.0)
    r.handle(RecoverStatusReported(node_rank=0, strategy="recover"), 42.0)
    out = r.handle(Tick(), 40.0 + ROUND_CFG.recover_timeout)
    assert r.state == S.RECOVERING and [s.strategy for s in out.signals] == ["job-rescheduling"]
    assert r.round.tried == ["recover", "job-rescheduling"] and r.restarts == 1  # one round: one restart


def test_a_fault_while_restored_recovering_is_queued_for_the_next_round() -> None:
    m = running_job()
    to(m, S.RECOVERING)
    r, _ = restart(m, 40.0)
    back(r, 41.0)
    assert "queued" in r.handle(FaultReported(node_rank=0, faults={0: "1"}), 41.5).info
    r.handle(RecoverStatusReported(node_rank=0, strategy="recover"), 42.0)
    out = r.handle(RecoverStatusReported(node_rank=1, strategy="recover"), 42.0)
    assert r.state == S.STOPPING and r.round.number == 2 and dict(out.signals[0].faults) == {0: "1"}


@pytest.mark.parametrize("state", [S.STOPPING, S.COLLECTING])
def test_an_undecided_round_is_run_again_once(state: S) -> None:
    m = running_job()
    to(m, state)
    r, _ = restart(m, 40.0)
    assert r.state == S.RESUMING
    # a stop complete or strategies answer of the old phase is not taken while the agents come back
    assert r.handle(StopComplete(node_rank=1), 40.5).code != 0
    got = back(r, 41.0)
    assert [s.signal_type for s in got[-1]] == ["stopTrain"] and r.state == S.STOPPING
    for n in (0, 1):
        out = r.handle(StopComplete(node_rank=n), 42.0)
    assert [s.signal_type for s in out.signals] == ["globalFault"]
    for n in (0, 1):
        out = r.handle(StrategiesReported(node_rank=n, strategies=OFFERED), 43.0)
    assert [s.strategy for s in out.signals] == ["recover"] and r.round.tried == ["recover"] and r.restarts == 1
    for n in (0, 1):
        r.handle(RecoverStatusReported(node_rank=n, strategy="recover"), 44.0)
    assert r.state == S.RUNNING and r.restarts == 1


def test_a_restart_while_resuming_runs_the_round_again_once() -> None:
    m = running_job()
    to(m, S.COLLECTING)
    r, _ = restart(m, 40.0)
    r.handle(AgentConnected(node_rank=0, host="h", pid=100), 41.0)
    r2, _ = restart(r, 50.0)  # killed again before every agent was back
    assert r2.state == S.RESUMING
    got = back(r2, 51.0)
    assert [s.signal_type for s in got[-1]] == ["stopTrain"]


def test_a_node_loss_round_restored_recovering_keeps_the_replacement_as_a_participant() -> None:
    """The live node-loss round of F2: the replacement's ranks already rejoined; a restart must not recover again."""
    m = running_job()
    m.handle(AgentDisconnected(node_rank=1), 5.0)
    for ev in m.due_events(10.0):
        m.handle(ev, 10.0)
    assert m.state == S.STOPPING and m.rejoining == {1: 10.0}
    m.handle(StopComplete(node_rank=0, host="h", pid=100), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=OFFERED, host="h", pid=100), 12.0)
    m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=1), 13.0)
    out = m.handle(AgentConnected(node_rank=1, host="h2", pid=201), 13.0)
    (change,) = out.signals
    assert m.state == S.RECOVERING and change.strategy == "recover"
    m.handle(RecoverStatusReported(node_rank=1, strategy="recover", host="h2", pid=201), 14.0)
    r, _ = restart(m, 40.0)
    assert r.state == S.RECOVERING and r.round.participants == {0, 1} and r.round.statuses == {1}
    assert r.handle(AgentConnected(node_rank=1, host="h2", pid=201), 41.0).direct == []  # its status is in
    assert r.handle(AgentConnected(node_rank=0, host="h", pid=100), 41.0).direct == [change]
    r.handle(RecoverStatusReported(node_rank=0, strategy="recover", host="h", pid=100), 42.0)
    assert r.state == S.RUNNING and r.restarts == 1 and r.rejoining == {}
