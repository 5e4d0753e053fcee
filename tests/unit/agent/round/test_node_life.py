"""A node's whole life through the round machine (agent/round/rules.py's lifecycle rules): how it began (first,
degraded, replacement, standby), a standby's wait and its take-over, and how it ends when no order ends it. The
supervisor only tells the machine what happened; what the node does next, and its state, are the machine's."""

from __future__ import annotations

import dataclasses

import pytest
from support.round_machine import NOW, S, change, covers, machine, of, order

from taskd.agent.config import AgentConfig
from taskd.agent.link.orders import Command
from taskd.agent.round import events as ev
from taskd.agent.round.states import NodeFacts
from taskd.vocabulary import SignalType, Strategy

FACTS = NodeFacts(node_count=2, live=False, controller_timeout=30.0)


def test_began_first_starts_every_rank_and_holds_the_node() -> None:
    covers("on_began_first")
    m = machine()
    assert m.handle(ev.BeganFirst(FACTS, 1), NOW) == [ev.StartJob()]
    assert m.state is S.RUNNING and m.node_rank == 1 and m.facts == FACTS and not m.standby


def test_began_degraded_starts_every_rank_and_recovers_alone() -> None:
    covers("on_began_degraded")
    m = machine()
    assert m.handle(ev.BeganDegraded(NodeFacts(), 0), NOW) == [ev.StartJob()]
    assert m.state is S.DEGRADED and m.degraded
    assert of(m.handle(ev.RankFault(0, 0, "1"), NOW), ev.StartRanks) == [ev.StartRanks(None)]


def test_began_replacement_starts_nothing_and_counts_from_the_loss() -> None:
    covers("on_began_replacement")
    m = machine()
    assert m.handle(ev.BeganReplacement(FACTS, 1, {2: "1", 3: "1"}, lost_at=NOW - 7.0), NOW) == []
    assert m.state is S.REJOINING and m.faults == {2: "1", 3: "1"} and m.started == NOW - 7.0
    assert m.rejoin_since == NOW and m.node_rank == 1
    assert of(m.handle(change(Strategy.JOB_RESCHEDULING, {2: "1", 3: "1"}), NOW + 1), ev.StartRanks)
    assert m.state is S.RESTARTING


def test_a_standbys_life_assigned_taken_and_replacing() -> None:
    covers("on_began_standby")
    m = machine()
    assert m.handle(ev.BeganStandby(FACTS, None), NOW) == [] and m.state is S.STANDBY and m.standby
    assert m.node_rank is None
    for ignored in (ev.StopOrder(order(Command.STOP)), ev.StrategiesOrder(order(Command.STRATEGIES)),
                    ev.RankFault(0, 0, "1"), ev.JobSeen("RUNNING")):  # a round's signals are not a standby's
        assert not of(m.handle(ignored, NOW), ev.Finish) and m.state is S.STANDBY
    assert m.handle(ev.AssignOrder(order(Command.ASSIGN, extra='{"node_rank": 1}')), NOW) == [ev.TakeNode(1)]
    m.handle(ev.BeganReplacement(FACTS, 1, {2: "1", 3: "1"}, NOW), NOW + 1)  # what TakeNode's registration led to
    assert m.state is S.REJOINING and m.node_rank == 1 and not m.standby and m.rejoin_since == NOW + 1


def test_a_standby_whose_job_ends_without_it_exits_0() -> None:
    covers("on_job_seen")
    for state, detail in (("SUCCEEDED", "the job is SUCCEEDED"), ("FAILED", "the job is FAILED"),
                          ("", "the controller no longer knows the job")):
        m = machine(S.STANDBY)
        [note, finish] = m.handle(ev.JobSeen(state), NOW)
        assert note.text == f"standby not needed: {detail}" and m.state is S.ENDED
        assert finish == ev.Finish(True, f"standby, not needed ({detail})", exit_code=0)
    m = machine(S.STANDBY)
    assert m.handle(ev.JobSeen("RUNNING"), NOW) == [] and m.state is S.STANDBY


def test_a_standby_whose_controller_is_silent_gives_up() -> None:
    covers("on_standby_lost")
    m = machine(S.STANDBY)
    [finish] = m.handle(ev.ControllerLost(31.0), NOW)
    assert finish.exit_code == 1 and "no answer from the controller for 30s" in finish.reason and m.state is S.ENDED


def test_a_replacement_with_no_strategy_in_time_gives_up() -> None:
    covers("on_rejoin_overdue")
    m = machine(S.REJOINING)
    note, finish = m.handle(ev.RejoinOverdue(300.0), NOW)
    assert "no strategy for this replacement node within 300s" in note.text
    assert finish == ev.Finish(False, "no strategy for the replacement within 300s", exit_code=1)
    assert m.state is S.ENDED
    assert machine(S.RUNNING).handle(ev.RejoinOverdue(300.0), NOW)[0].level < 20, "only a replacement's"


def test_a_signal_stops_every_rank_and_exits_128_plus_it() -> None:
    covers("on_signalled")
    m = machine(S.STOPPING)
    note, finish = m.handle(ev.Signalled(15, "SIGTERM"), NOW)
    assert note.text == "received SIGTERM: stopping every rank" and m.state is S.ENDED
    assert finish == ev.Finish(False, "agent received SIGTERM", exit_code=143)


def test_a_standby_stopped_by_a_signal_exits_1() -> None:
    covers("on_standby_signalled")
    m = machine(S.STANDBY)
    assert m.handle(ev.Signalled(2, "SIGINT"), NOW) == [
        ev.Finish(False, "standby stopped by a signal before it was needed", exit_code=1)]


@pytest.mark.parametrize("state", [S.RUNNING, S.STANDBY, S.REJOINING, S.REBUILDING, S.DEGRADED])
def test_ended_finishes_with_its_reason_in_any_state(state: S) -> None:
    covers("on_ended")
    m = machine(state)
    assert m.handle(ev.Ended(False, 1, "no controller answered"), NOW) == [
        ev.Finish(False, "no controller answered", exit_code=1)]
    assert m.state is S.ENDED and m.handle(ev.Ended(True, 0, ""), NOW) == [], "once"


def test_the_configuration_is_frozen() -> None:
    """What changes while the job runs (its node, standby or not) is the machine's, not the configuration's."""
    config = AgentConfig(standby=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.node_rank = 1  # type: ignore[misc]
    assert AgentConfig(strategies="recover,exit").strategies == [Strategy.RECOVER, Strategy.EXIT]


def test_a_kill_ends_a_standby_with_0_and_a_fence_with_1() -> None:
    m = machine(S.STANDBY)
    assert of(m.handle(ev.KillOrder(order(Command.KILL, signal_type=SignalType.KILL_MASTER)), NOW),
              ev.Finish)[0].exit_code == 0
    m = machine(S.STANDBY)
    assert of(m.handle(ev.FenceOrder(order(Command.FENCE, extra='{"reason": "r"}')), NOW),
              ev.Finish) == [ev.Finish(False, "fenced: r", exit_code=1)]
