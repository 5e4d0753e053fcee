"""The agent's round machine (agent/round/rules.py: RoundMachine over RULES): one test per rule, the table's checks,
and the paths that used to be nested calls. No process, no network: the node is a stand-in `NodeView`, the clock
a number passed in."""

from __future__ import annotations

import logging

import pytest
from support.round_machine import NOW, S, change, covers, fault, machine, of, order

from taskd.agent.link.orders import Command
from taskd.agent.round import events as ev
from taskd.agent.round.rules import RULES, UNCHANGED, Rule, TransitionError, check_target, find_rule, index_rules
from taskd.agent.round.states import NodeState
from taskd.vocabulary import Code, FaultType, SignalType, Strategy

# ------------------------------------------------------------------------------------------------ the table

def test_the_table_claims_each_event_and_state_once() -> None:
    index_rules(RULES)
    twice = (*RULES, Rule(frozenset({S.RUNNING}), ev.RankFault, frozenset({S.REPORTING}), RULES[0].handler))
    with pytest.raises(ValueError, match="claimed by both"):
        index_rules(twice)
    with pytest.raises(ValueError, match="not an event type"):
        index_rules([Rule(frozenset({S.RUNNING}), int, frozenset({S.RUNNING}), RULES[0].handler)])


def test_a_handler_landing_outside_its_rules_targets_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = find_rule(ev.RankFault, S.RUNNING)
    assert rule is not None
    with pytest.raises(TransitionError, match="on_fault moved RUNNING to ENDED"):
        check_target(rule, S.RUNNING, S.ENDED)
    m = machine()
    bad = Rule(frozenset({S.RUNNING}), ev.RankFault, frozenset({S.REPORTING}), lambda *_: S.ENDED)
    monkeypatch.setattr("taskd.agent.round.rules.find_rule", lambda *_: bad)
    with pytest.raises(TransitionError, match="moved RUNNING to ENDED, table allows REPORTING"):
        m.handle(fault(), NOW)
    assert m.state is S.RUNNING, "a refused transition changes nothing"


def test_unchanged_allows_only_the_state_the_node_was_in() -> None:
    rule = find_rule(ev.StrategiesOrder, S.STOPPING)
    assert rule is not None and UNCHANGED in rule.targets
    check_target(rule, S.STOPPING, S.STOPPING)
    with pytest.raises(TransitionError):
        check_target(rule, S.STOPPING, S.RUNNING)


def test_an_event_no_rule_takes_is_dropped_and_terminal_states_take_nothing() -> None:
    m = machine(S.STANDBY)
    [note] = m.handle(fault(), NOW)
    assert isinstance(note, ev.Note) and "no rule" in note.text and m.state is S.STANDBY
    m = machine(S.ENDED)
    assert m.handle(change(Strategy.RECOVER), NOW) == [] and m.state is S.ENDED


# ------------------------------------------------------------------------------------------------ rank faults

@pytest.mark.parametrize("state", [S.RUNNING, S.REPORTING, S.STOPPING, S.RESUMING])
def test_on_fault_reports_and_opens_the_round(state: NodeState) -> None:
    covers("on_fault")
    m = machine(state)
    actions = m.handle(fault(1), NOW)
    assert m.state is S.REPORTING and m.faults == {1: "1"} and m.started == NOW
    [report] = of(actions, ev.SendReport)
    assert report.kind == ev.FAULT and report.faults == {1: "1"} and "rank 1" in report.detail


@pytest.mark.parametrize("live", [False, True])
def test_on_fault_of_a_gone_rank_tells_a_live_group_to_leave_before_the_report(live: bool) -> None:
    """Issue 20 item 2: the agent knows within milliseconds; the survivors must not wait for the ring."""
    covers("on_fault")
    actions = machine(S.RUNNING, live=live).handle(fault(1), NOW)
    kinds = [type(a) for a in actions]
    if live:
        assert kinds.index(ev.LeaveGroup) < kinds.index(ev.SendReport), kinds
    else:
        assert ev.LeaveGroup not in kinds, "no live group: nothing to leave"


def test_a_type_0_fault_keeps_the_live_group_for_a_retry() -> None:
    covers("on_fault")
    actions = machine(S.RUNNING, live=True).handle(fault(1, FaultType.RECOVERABLE), NOW)
    assert not of(actions, ev.LeaveGroup), "a retryable error redoes the step in the same group"


def test_on_fault_rebuilding_is_absorbed_by_the_rebuild() -> None:
    covers("on_fault_rebuilding")
    m = machine(S.REBUILDING, live=True)
    actions = m.handle(fault(0), NOW)
    assert m.state is S.REBUILDING and not of(actions, ev.SendReport), "the rebuild's check reports it, not a report"
    assert actions == [ev.LeaveGroup()], "the group being formed has lost a rank: the ranks leave it at once"


def _rebuilding(strategy: str) -> object:
    m = machine(S.RUNNING, live=True)
    m.handle(change(strategy, extra='{"world_size": 4, "rank_map": {"0": 0, "1": 1, "2": 2, "3": 3}}'), NOW)
    m.handle(ev.StartResult(0), NOW)
    assert m.state is S.REBUILDING
    return m


@pytest.mark.parametrize("strategy", [Strategy.RECOVER, Strategy.UPGRADE, Strategy.DOWNGRADE])
def test_a_survivor_that_ended_stuck_is_started_again_into_the_rebuild_once(strategy: str) -> None:
    """worker/torch_stuck.py: a survivor left blocked in its broken group ends itself (exit 75) while its group
    re-forms. Its peers hold its state: it starts again into the generation being formed, where it used to fail
    the recover (and a resize, whose next strategy is exit, the job). Once: a second stuck exit fails as any."""
    covers("on_fault_rebuilding")
    covers("on_restarted_rebuilding")
    m = _rebuilding(strategy)
    stuck = ev.RankFault(0, 0, FaultType.PROCESS, "rank 0 exited with code 75", stuck=True)
    actions = m.handle(stuck, NOW + 6)
    assert m.state is S.REBUILDING and of(actions, ev.StartRanks) == [ev.StartRanks((0,))], actions
    assert not of(actions, ev.LeaveGroup) and not of(actions, ev.SendReport), "the group being formed waits for it"
    assert "started again into the group being re-formed" in of(actions, ev.Note)[0].text
    assert m.handle(ev.StartResult(0), NOW + 6) == [] and m.state is S.REBUILDING
    assert m.handle(stuck, NOW + 9) == [ev.LeaveGroup()] and m.state is S.REBUILDING, "once per rank and rebuild"


def test_a_stuck_survivor_that_cannot_be_started_again_fails_the_recover() -> None:
    covers("on_restarted_rebuilding")
    m = _rebuilding(Strategy.RECOVER)
    m.handle(ev.RankFault(0, 0, FaultType.PROCESS, "exit 75", stuck=True), NOW + 6)
    actions = m.handle(ev.StartResult(1, "START_WORKER_LIST([0]) returned 1"), NOW + 6)
    assert m.state is S.STOPPING and of(actions, ev.LeaveGroup) and of(actions, ev.AbandonRebuild)
    [report] = of(actions, ev.SendReport)
    assert report.kind == ev.STATUS and report.code == 1 and "could not be started again" in report.detail


def test_a_stuck_exit_outside_a_live_rebuild_is_an_ordinary_fault() -> None:
    covers("on_fault_rebuilding")
    m = _rebuilding(Strategy.RECOVER)
    m.plan = None  # type: ignore[attr-defined]
    assert m.handle(ev.RankFault(0, 0, FaultType.PROCESS, "exit 75", stuck=True), NOW) == [ev.LeaveGroup()]
    actions = machine(S.RUNNING, live=True).handle(ev.RankFault(0, 0, FaultType.PROCESS, "75", stuck=True), NOW)
    assert of(actions, ev.SendReport), "before the rebuild it is reported: the round restarts it as a fault rank"


def test_on_fault_degraded_restarts_every_rank_locally_until_the_budget_is_spent() -> None:
    covers("on_fault_degraded")
    m = machine(S.DEGRADED, max_restarts=1)
    actions = m.handle(fault(1), NOW)
    assert m.state is S.RESTARTING and of(actions, ev.StartRanks) == [ev.StartRanks(None)]
    assert of(actions, ev.SetRestartCount) == [ev.SetRestartCount(1)]
    assert not of(actions, ev.SendReport), "no controller: nothing reported"
    m.handle(ev.StartResult(0), NOW + 1)
    assert m.state is S.DEGRADED
    actions = m.handle(fault(1), NOW + 2)
    assert m.state is S.ENDED and of(actions, ev.Finish)[0].reason == "restart budget of 1 spent"


# ------------------------------------------------------------------------------------------------ the controller

def test_on_report_settled_taken_hands_the_round_to_the_controller() -> None:
    covers("on_report_settled")
    m = machine()
    m.handle(fault(), NOW)
    assert m.handle(ev.ReportSettled(True), NOW + 0.01) == [] and m.state is S.STOPPING
    m = machine(S.STOPPING)
    m.handle(ev.ReportSettled(True), NOW)
    assert m.state is S.STOPPING, "taken after stopTrain came: unchanged"


def test_a_report_not_taken_within_the_controller_timeout_degrades_a_single_node() -> None:
    m = machine()
    m.handle(fault(), NOW)
    actions = m.handle(ev.ReportSettled(False), NOW + 30.0)
    assert m.state is S.RESTARTING and m.degraded
    notes = [a.text for a in of(actions, ev.Note)]
    assert "the controller did not take the fault report for 30s (unreachable or failing): degraded mode, " \
           "restarts handled locally" in notes
    assert of(actions, ev.StartRanks) == [ev.StartRanks(None)]
    m.handle(ev.StartResult(0), NOW + 31)
    assert m.state is S.DEGRADED
    assert m.handle(ev.ReportSettled(False), NOW + 32) == [] and m.state is S.DEGRADED, "degraded once"


def test_a_multi_node_job_ends_instead_of_degrading() -> None:
    m = machine(nodes=2)
    m.handle(fault(), NOW)
    actions = m.handle(ev.ReportSettled(False), NOW + 30.0)
    [finish] = of(actions, ev.Finish)
    assert m.state is S.ENDED and not m.degraded and not of(actions, ev.StartRanks)
    assert finish.reason.endswith("no recovery without the controller for a multi-node job")


@pytest.mark.parametrize("state", [S.STOPPING, S.REBUILDING])
def test_on_controller_lost_in_a_round_degrades(state: NodeState) -> None:
    covers("on_controller_lost")
    m = machine(state)
    m.faults, m.started = {1: "1"}, NOW
    actions = m.handle(ev.ControllerLost(30.4), NOW + 31)
    assert m.state is S.RESTARTING
    assert any("controller lost for 30s in the middle of a recovery" in a.text for a in of(actions, ev.Note))


def test_degraded_budget_counts_on_from_the_controllers_count() -> None:
    """The controller said 2 of 3 restarts were spent: degraded mode has one left, not three."""
    m = machine(max_restarts=3)
    m.handle(ev.StopOrder(order(Command.STOP, signal_type=SignalType.STOP_TRAIN)), NOW)
    m.handle(change(Strategy.RECOVER, extra='{"generation": 5, "restarts": 2}'), NOW)
    assert m.restarts == 2 and m.budget.restarts_used == 2
    m.handle(ev.StartResult(0), NOW)
    m.handle(fault(), NOW + 10)
    actions = m.handle(ev.ReportSettled(False), NOW + 40)
    assert "restart 3 of 3" in " ".join(a.text for a in of(actions, ev.Note))
    assert of(actions, ev.SetRestartCount) == [ev.SetRestartCount(3)]
    m.handle(ev.StartResult(0), NOW + 41)
    actions = m.handle(fault(), NOW + 50)
    assert m.state is S.ENDED and "restart budget of 3 spent" in of(actions, ev.Finish)[0].reason


def test_without_the_controllers_count_a_round_is_charged_once_here() -> None:
    """ClusterD sends no restart count: a recover that fails and escalates to job-rescheduling is one restart."""
    m = machine()
    m.handle(fault(), NOW)
    m.handle(change(Strategy.RECOVER), NOW)
    m.handle(ev.StartResult(3, "START_WORKER_LIST([1]) returned 3"), NOW)
    assert m.state is S.STOPPING
    actions = m.handle(change(Strategy.JOB_RESCHEDULING), NOW + 1)
    assert m.restarts == 1 and of(actions, ev.SetRestartCount) == [ev.SetRestartCount(1)]


def test_the_controllers_count_wins_over_the_agents() -> None:
    m = machine()
    m.restarts = 5
    actions = m.handle(change(Strategy.JOB_RESCHEDULING, extra='{"restarts": 1}'), NOW)
    assert m.restarts == 1 and of(actions, ev.SetRestartCount) == [ev.SetRestartCount(1)]


@pytest.mark.parametrize("state", [S.RUNNING, S.REPORTING, S.STOPPING, S.RESUMING, S.REBUILDING])
def test_on_stop_stops_this_nodes_fault_ranks_and_says_so(state: NodeState) -> None:
    covers("on_stop")
    m = machine(state, live=True, paused=(0,))
    actions = m.handle(ev.StopOrder(order(Command.STOP, faults={0: "0", 1: "1", 7: "1"})), NOW)
    assert m.state is S.STOPPING
    assert of(actions, ev.StopRanks) == [ev.StopRanks((1,), graceful=False)], "rank 0 is paused in place: kept"
    assert of(actions, ev.Supersede) == [ev.Supersede(restart=False)]
    [report] = of(actions, ev.SendReport)
    assert report.kind == ev.STOP_COMPLETE and report.faults == {0: "0", 1: "1", 7: "1"}
    # strategies offered for a collection this stop ended, and a recover status of a round the controller moved
    # past (issue 31, F2), are withdrawn before the stop complete is sent
    [withdraw] = of(actions, ev.WithdrawReports)
    assert set(withdraw.kinds) == {ev.STRATEGIES, ev.STATUS} and actions.index(withdraw) < actions.index(report)
    assert of(actions, ev.LeaveGroup) == [ev.LeaveGroup()], "ranks 1 and 7 are gone: the group is broken"


def test_a_node_loss_stop_counts_the_round_from_the_fault_not_its_declaration() -> None:
    """issue 32, F6: "training resumed N s after the fault" counted from the loss's declaration, a grace late."""
    covers("on_stop")
    m = machine(S.RUNNING, live=True)
    m.handle(ev.StopOrder(order(Command.STOP, faults={7: "1"}, extra='{"fault_ago": 5.0, "awaiting": [1]}')), NOW)
    assert m.started == NOW - 5.0
    for bad in ('{"fault_ago": -1}', '{"fault_ago": true}', '{"fault_ago": "5"}', '{"fault_ago": 1e9}', "{}", "x"):
        other = machine(S.RUNNING, live=True)
        other.handle(ev.StopOrder(order(Command.STOP, faults={7: "1"}, extra=bad)), NOW)
        assert other.started == NOW, bad


def test_on_stop_for_a_retryable_error_elsewhere_keeps_the_group() -> None:
    covers("on_stop")
    m = machine(S.RUNNING, live=True)
    actions = m.handle(ev.StopOrder(order(Command.STOP, faults={7: "0"})), NOW)
    assert not of(actions, ev.LeaveGroup) and of(actions, ev.SendReport)[0].kind == ev.STOP_COMPLETE


@pytest.mark.parametrize("state", [S.DEGRADED, S.REJOINING])
def test_on_stop_in_degraded_or_rejoining_keeps_the_state(state: NodeState) -> None:
    covers("on_stop")
    m = machine(state)
    actions = m.handle(ev.StopOrder(order(Command.STOP, faults={5: "1"})), NOW)
    assert m.state is state and of(actions, ev.StopRanks) == [ev.StopRanks((), graceful=False)]
    assert of(actions, ev.SendReport)[0].kind == ev.STOP_COMPLETE


def test_on_strategies_offers_for_the_whole_round() -> None:
    covers("on_strategies")
    m = machine(S.STOPPING)
    m.faults = {0: "1"}
    actions = m.handle(ev.StrategiesOrder(order(Command.STRATEGIES, faults={1: "1"})), NOW)
    assert actions == [ev.OfferStrategies({1: "1"}, {0: "1", 1: "1"})] and m.state is S.STOPPING


def test_on_change_recover_restarts_the_faulty_local_ranks() -> None:
    covers("on_change")
    m = machine(S.STOPPING)
    m.faults, m.started = {1: "1"}, NOW - 1
    actions = m.handle(change(Strategy.RECOVER, {1: "1", 9: "1"}), NOW)
    assert m.state is S.RESTARTING and of(actions, ev.StartRanks) == [ev.StartRanks((1,))]
    assert m.plan is not None and m.plan.started == NOW - 1, "the record measures from the fault"


def test_on_change_job_rescheduling_restarts_every_rank() -> None:
    m = machine(S.STOPPING)
    actions = m.handle(change(Strategy.JOB_RESCHEDULING), NOW)
    assert m.state is S.RESTARTING and of(actions, ev.StartRanks) == [ev.StartRanks(None)]


def test_on_change_live_names_the_controllers_generation_and_retry_restarts_nothing() -> None:
    m = machine(S.STOPPING, live=True)
    actions = m.handle(change(Strategy.RETRY, {1: "0"}, '{"generation": 9, "restarts": 0}'), NOW)
    assert m.state is S.REBUILDING and not of(actions, ev.StartRanks) and not of(actions, ev.SetRestartCount)
    [rebuild] = of(actions, ev.BeginRebuild)
    assert rebuild.generation == 9 and rebuild.strategy == Strategy.RETRY


def test_on_change_exit_dump_and_unknown() -> None:
    m = machine(S.STOPPING)
    actions = m.handle(change(Strategy.EXIT, extra='{"reason": "agent of node 1 lost"}'), NOW)
    assert m.state is S.ENDED and of(actions, ev.StopRanks) == [ev.StopRanks(None, graceful=True)]
    assert of(actions, ev.Finish)[0].reason == "the controller chose exit: agent of node 1 lost"
    m = machine(S.STOPPING)
    assert of(m.handle(change(Strategy.DUMP), NOW), ev.Dump) and m.state is S.ENDED
    m = machine(S.STOPPING)
    [status] = of(m.handle(change("teleport"), NOW), ev.SendReport)
    assert status.code == Code.RETRY_FAILED_UNRECOVERABLE and m.state is S.STOPPING


def test_on_change_in_rejoining_starts_the_replacements_ranks() -> None:
    """A replacement node's fault ranks are all of its ranks: recover starts them in the new generation."""
    m = machine(S.REJOINING, live=True)
    actions = m.handle(change(Strategy.RECOVER, {0: "1", 1: "1"}, '{"generation": 4, "restarts": 1}'), NOW)
    assert m.state is S.RESTARTING and of(actions, ev.StartRanks) == [ev.StartRanks((0, 1))]
    assert of(actions, ev.BeginRebuild)[0].generation == 4


def test_on_dump_ends_the_job_after_the_save() -> None:
    covers("on_dump")
    m = machine(S.STOPPING)
    assert m.handle(ev.DumpOrder(order(Command.DUMP)), NOW) == [ev.Dump({1: "1"}, 30.0)] and m.state is S.ENDED


def test_on_kill_ends_the_job() -> None:
    covers("on_kill")
    m = machine()
    actions = m.handle(ev.KillOrder(order(Command.KILL, extra='{"reason": "job ended"}',
                                          signal_type=SignalType.KILL_MASTER)), NOW)
    assert m.state is S.ENDED and of(actions, ev.Finish)[0].reason == "controller sent killMaster: job ended"


def test_on_standby_end_exits_0_when_the_job_ends() -> None:
    covers("on_standby_end")
    m = machine(S.STANDBY)
    [note, finish] = m.handle(ev.KillOrder(order(Command.KILL, signal_type=SignalType.KILL_MASTER)), NOW)
    assert note.text == "standby not needed: killMaster"
    assert finish == ev.Finish(True, "standby, not needed (killMaster)", exit_code=0) and m.state is S.ENDED
    m = machine(S.STANDBY)
    m.handle(change(Strategy.RECOVER), NOW)
    assert m.state is S.STANDBY
    actions = m.handle(change(Strategy.EXIT, extra='{"reason": "job ended"}'), NOW)
    assert m.state is S.ENDED and of(actions, ev.Finish)[0].reason == "standby, not needed (job ended)"


@pytest.mark.parametrize("state", [S.RUNNING, S.REBUILDING, S.STANDBY, S.DEGRADED])
def test_on_fence_kills_every_rank_and_exits_1(state: NodeState) -> None:
    covers("on_fence")
    m = machine(state)
    actions = m.handle(ev.FenceOrder(order(Command.FENCE, extra='{"reason": "node 0 is now held by h:7"}')), NOW)
    assert m.state is S.FENCED
    assert of(actions, ev.StopRanks) == [ev.StopRanks(None, graceful=False)]
    assert of(actions, ev.Finish) == [ev.Finish(False, "fenced: node 0 is now held by h:7", exit_code=1)]
    assert m.handle(fault(), NOW) == [], "fenced is terminal"


def test_on_assign_has_a_standby_take_the_node_and_waits_for_how_that_went() -> None:
    covers("on_assign")
    m = machine(S.STANDBY)
    assert m.handle(ev.AssignOrder(order(Command.ASSIGN, extra='{"node_rank": 1}')), NOW) == [ev.TakeNode(1)]
    assert m.state is S.STANDBY, "the registration's outcome (BeganReplacement, Ended, nothing) is the next event"
    for extra in ("{}", '{"node_rank": -1}', '{"node_rank": true}', "{not json"):
        [note] = m.handle(ev.AssignOrder(order(Command.ASSIGN, extra=extra)), NOW)
        assert "names no node rank" in note.text and m.state is S.STANDBY


def test_on_assign_ignored_when_not_a_standby() -> None:
    covers("on_assign_ignored")
    m = machine(S.RUNNING)
    [note] = m.handle(ev.AssignOrder(order(Command.ASSIGN, extra='{"node_rank": 1}')), NOW)
    assert "not a standby" in note.text and m.state is S.RUNNING


def test_on_migrate_starts_the_migration_beside_the_round_machine() -> None:
    covers("on_migrate")
    m = machine(S.RUNNING)
    migrate = order(Command.MIGRATE, extra='{"rank": 1, "generation": 4}')
    assert migrate.rank == 1 and migrate.generation == 4
    assert m.handle(ev.MigrateOrder(migrate), NOW) == [ev.StartMigration(migrate)] and m.state is S.RUNNING


def test_a_standby_prepares_a_node_migration_and_runs_the_node_once_its_ranks_joined() -> None:
    covers("on_successor_joined")
    m = machine(S.STANDBY)
    prepare = order(Command.MIGRATE, extra='{"stage": "prepare", "node_rank": 1, "generation": 7}')
    assert prepare.stage == "prepare" and prepare.node_rank == 1 and prepare.generation == 7
    assert m.handle(ev.MigrateOrder(prepare), NOW) == [ev.StartMigration(prepare)] and m.state is S.STANDBY
    assert m.handle(ev.SuccessorJoined(1), NOW) == [] and m.state is S.RUNNING and m.node_rank == 1


def test_a_standby_whose_node_migration_was_called_off_waits_again() -> None:
    """Still a healthy spare: no Finish (it exited 1 before), a warning naming why, and it stays a standby, which
    the next assignment or migration may use (tests/e2e/agent/test_migrate_node.py reuses it)."""
    covers("on_successor_gave_up")
    m = machine(S.STANDBY)
    m.handle(ev.MigrateOrder(order(Command.MIGRATE, extra='{"stage": "prepare", "node_rank": 1, "generation": 7}')),
             NOW)
    [said] = m.handle(ev.SuccessorGaveUp("the successor could not take node 1: rank(s) [1] ended"), NOW)
    assert isinstance(said, ev.Note) and said.level == logging.WARNING and m.state is S.STANDBY, said
    assert said.text == ("the successor could not take node 1: rank(s) [1] ended: this standby waits again for a "
                         "node to take over (or the job's end)")
    assert m.handle(ev.AssignOrder(order(Command.ASSIGN, extra='{"node_rank": 1}')), NOW) == [ev.TakeNode(1)]


def test_on_migrate_refused_while_a_round_is_under_way() -> None:
    covers("on_migrate_refused")
    m = machine(S.STOPPING)
    [start] = m.handle(ev.MigrateOrder(order(Command.MIGRATE, extra='{"rank": 1, "generation": 4}')), NOW)
    assert "this node is STOPPING, not RUNNING" in start.refused and m.state is S.STOPPING


# ------------------------------------------------------------------------------------------------ results

def test_on_started_reports_records_and_waits_for_the_resumption() -> None:
    covers("on_started")
    m = machine(S.STOPPING)
    m.handle(change(Strategy.RECOVER), NOW)
    actions = m.handle(ev.StartResult(0), NOW + 0.5)
    assert m.state is S.RESUMING and m.faults == {}, "the round is over here; training's resumption is next"
    assert of(actions, ev.SendReport)[0].code == Code.OK
    assert not of(actions, ev.SendReport)[0].rejoined, "only started: the controller's settle rule must know"
    assert of(actions, ev.RecordRestart) == [ev.RecordRestart(Strategy.RECOVER, (1,), NOW)]


def test_a_hangs_recovery_counts_from_its_last_heartbeat_not_its_detection() -> None:
    """Issue 18: "training resumed N s after the fault" for a hang counts from the stall (its last heartbeat)."""
    m = machine()
    m.handle(ev.RankFault(1, 1, FaultType.PROCESS, "rank 1 hang: last heartbeat 5.6s ago", unseen=5.6), NOW)
    assert m.started == pytest.approx(NOW - 5.6)
    m.handle(ev.RankFault(0, 0, FaultType.PROCESS, "rank 0 exited"), NOW + 1)  # a later fault: the earliest stays
    m.state = S.STOPPING
    m.handle(change(Strategy.RECOVER), NOW + 2)
    [record] = of(m.handle(ev.StartResult(0), NOW + 3), ev.RecordRestart)
    assert record.started == pytest.approx(NOW - 5.6)


def test_on_started_failed_reports_1_and_waits_for_the_next_strategy() -> None:
    m = machine(S.STOPPING)
    m.handle(change(Strategy.RECOVER), NOW)
    actions = m.handle(ev.StartResult(2, "START_WORKER_LIST([1]) returned 2"), NOW)
    assert m.state is S.STOPPING and of(actions, ev.AbandonRebuild)
    [status] = of(actions, ev.SendReport)
    assert status.code == 1 and status.detail == "START_WORKER_LIST([1]) returned 2"


def test_on_started_live_recover_waits_for_the_group() -> None:
    m = machine(S.STOPPING, live=True)
    m.handle(change(Strategy.RECOVER), NOW)
    assert m.handle(ev.StartResult(0), NOW) == [] and m.state is S.REBUILDING


def test_on_rejoined_reports_and_records_the_generation() -> None:
    covers("on_rejoined")
    m = machine(S.STOPPING, live=True)
    m.handle(change(Strategy.RECOVER), NOW)
    m.handle(ev.StartResult(0), NOW)
    actions = m.handle(ev.GroupRejoined(3, NOW), NOW + 0.4)
    assert m.state is S.RESUMING and of(actions, ev.SendReport)[0].code == Code.OK
    assert of(actions, ev.SendReport)[0].rejoined, "the group re-formed: the recover settled (controller's rule)"
    assert of(actions, ev.RecordRestart)[0].generation == 3


def test_on_rejoined_unreported_only_says_so() -> None:
    covers("on_rejoined_unreported")
    m = machine(S.RESUMING, live=True)
    [note] = m.handle(ev.GroupRejoined(2, NOW), NOW + 0.25)
    assert "the group re-formed (generation 2, job-rescheduling) 0.250s after the fault" == note.text
    assert m.state is S.RESUMING


def test_on_group_failed_reports_and_waits_for_the_next_strategy() -> None:
    covers("on_group_failed")
    m = machine(S.STOPPING, live=True)
    m.handle(change(Strategy.RETRY, {1: "0"}), NOW)
    actions = m.handle(ev.GroupFailed("rank(s) [1] did not rejoin generation 1 within 27s"), NOW + 27)
    assert m.state is S.STOPPING
    assert of(actions, ev.SendReport)[0].code == Code.RETRY_FAILED_UNRECOVERABLE


def test_on_group_failed_unreported_gives_up_on_the_resumption() -> None:
    covers("on_group_failed_unreported")
    m = machine(S.RESUMING, live=True)
    actions = m.handle(ev.GroupFailed("rank(s) [0] ended"), NOW)
    assert m.state is S.RUNNING and of(actions, ev.AbandonRebuild) and not of(actions, ev.SendReport)


def test_on_resumed_ends_the_round_here() -> None:
    covers("on_resumed")
    m = machine(S.RESUMING)
    assert m.handle(ev.Resumed(), NOW) == [] and m.state is S.RUNNING
    m = machine(S.STOPPING)
    m.handle(ev.Resumed(seen=False), NOW)
    assert m.state is S.STOPPING, "a resumption seen after a new fault is only recorded"


def test_training_resumed_after_the_controllers_round_is_told_to_it_naming_the_round() -> None:
    m = machine(S.STOPPING, live=True)
    m.handle(change(Strategy.RECOVER, extra='{"generation": 5, "restarts": 1, "round": 7}'), NOW)
    m.handle(ev.StartResult(0), NOW)
    m.handle(ev.GroupRejoined(5, NOW), NOW + 0.4)
    actions = m.handle(ev.Resumed(seconds=1.5, at=NOW + 1.5), NOW + 1.5)
    assert m.state is S.RUNNING and of(actions, ev.TellResumed) == [ev.TellResumed(7, 1.5, NOW + 1.5, True)]
    # a job-rescheduling whose ranks write no heartbeat steps: the controller hears that nothing here can tell
    m = machine(S.STOPPING)
    m.handle(change(Strategy.JOB_RESCHEDULING, extra='{"round": 2}'), NOW)
    m.handle(ev.StartResult(0), NOW)
    assert of(m.handle(ev.Resumed(seen=False), NOW + 1), ev.TellResumed) == [ev.TellResumed(2, 0.0, 0.0, False)]


def test_without_a_round_from_taskds_controller_nothing_is_told() -> None:
    m = machine(S.STOPPING)
    m.handle(change(Strategy.RECOVER, extra='{"generation": 5}'), NOW)  # ClusterD names no round
    m.handle(ev.StartResult(0), NOW)
    assert of(m.handle(ev.Resumed(seconds=1.0, at=NOW), NOW), ev.TellResumed) == [] and m.state is S.RUNNING
    m = machine(S.DEGRADED)  # degraded: no controller to tell
    m.handle(fault(1), NOW)
    m.handle(ev.StartResult(0), NOW)
    assert of(m.handle(ev.Resumed(seconds=1.0, at=NOW), NOW), ev.TellResumed) == []


def test_a_rank_gone_when_the_start_returned_is_a_new_round_after_the_restart() -> None:
    """Today's re-entry, as queued events: the start's result is handled first (status 0 reported, the restart
    recorded), and only then the rank found gone opens a round of its own."""
    m = machine(S.STOPPING)
    m.handle(change(Strategy.RECOVER), NOW)
    after_start = m.handle(ev.StartResult(0), NOW)
    assert m.state is S.RESUMING and of(after_start, ev.RecordRestart)
    actions = m.handle(fault(1), NOW + 0.01)
    assert m.state is S.REPORTING and m.faults == {1: "1"} and of(actions, ev.SendReport)[0].kind == ev.FAULT


def test_every_rule_has_a_test() -> None:
    import inspect
    import sys
    from pathlib import Path
    source = inspect.getsource(sys.modules[__name__]) + (Path(__file__).parent / "test_node_life.py").read_text()
    missing = [r.handler.__name__ for r in RULES if f'covers("{r.handler.__name__}")' not in source]
    assert missing == []


def test_the_docs_table_is_generated_from_the_current_rules(tmp_path) -> None:  # noqa: ANN001
    from pathlib import Path

    from taskd.agent.round import rules as round_table
    doc = Path(__file__).resolve().parents[4] / "docs" / "architecture.md"
    text = doc.read_text(encoding="utf-8")
    assert round_table.update_doc(text) == text, "run: python -m taskd.agent.round.rules --write docs/architecture.md"
    stale = tmp_path / "architecture.md"
    stale.write_text(text.replace("on_fault_degraded", "on_something_else"), encoding="utf-8")
    assert round_table.main(["--check", str(stale)]) == 1
    assert round_table.main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text
    assert round_table.main(["--check", str(stale)]) == 0
