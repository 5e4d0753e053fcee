"""The agent's round as a rule table: for each event type and node state, the one rule that handles it.

Rules mean what taskd/rule_table.py says, as in the controller's table (taskd/controller/machine/table.py), and
`RULES` is checked when this module loads. An event no rule takes in a state is dropped (and logged) by the
machine, `RoundMachine`, here too: one node's recovery as a pure state machine over the table.

Events go in (with the time, monotonic, passed by the caller) and actions come out; the machine does no
I/O, reads no clock and touches no process, and it imports only the standard library and its own parts
(an order is `agent/link/orders.py`'s, not the gRPC link's: tests/unit/agent/round/test_machine_imports.py). The
parts: `events` (what goes in and comes out), `states` (the states and the machine's data), `handlers`
(one function per rule) and this table (which handler runs for which event in which state, and where it
may lead). The supervisor sequences it: it pulls events (rank exits, orders, timers, signals), feeds them
here one at a time, and has the executors (agent/round/actions.py) carry out the actions; whatever those
produce (a start's result, the ranks it found already gone) is queued as the next events, never handled
inside the handler that caused them.

docs/architecture.md embeds `describe_table(markdown=True)`; refresh it with
`python -m taskd.agent.round.rules --write docs/architecture.md` (a test fails when it is stale).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from taskd.agent.round import handlers as h
from taskd.agent.round.events import (
    EVENT_TYPES,
    Action,
    AssignOrder,
    BeganDegraded,
    BeganFirst,
    BeganReplacement,
    BeganStandby,
    ChangeOrder,
    ControllerLost,
    DumpOrder,
    Ended,
    FenceOrder,
    GroupFailed,
    GroupRejoined,
    JobSeen,
    KillOrder,
    MigrateOrder,
    Note,
    RankFault,
    RejoinOverdue,
    ReportSettled,
    Resumed,
    Signalled,
    StartResult,
    StopOrder,
    StrategiesOrder,
    SuccessorGaveUp,
    SuccessorJoined,
)
from taskd.agent.round.states import ANY, TERMINAL, WITH_RANKS, NodeRound, NodeState
from taskd.doc_block import DocBlock
from taskd.rule_table import UNCHANGED, Rule, RuleTable, TransitionError, Unchanged, check_target

S = NodeState
Handler = Callable[[NodeRound, Any, float, list], NodeState]
Target = NodeState | Unchanged
NodeRule = Rule[NodeState, Handler]


def _states(*states: NodeState) -> frozenset[NodeState]:
    return frozenset(states)


def _targets(*targets: Target) -> frozenset[Target]:
    return frozenset(targets)


ROUND_OPEN = _states(S.RUNNING, S.REPORTING, S.STOPPING, S.RESUMING)  # a fault here is reported
ORDERED = _states(S.RUNNING, S.REPORTING, S.STOPPING, S.RESUMING, S.REBUILDING)  # the controller leads a round
UNREPORTED = WITH_RANKS - {S.REBUILDING, S.RESTARTING}  # a rebuild the controller does not wait on (or none)

RULES: tuple[NodeRule, ...] = (
    # a rank of this node fails
    Rule(ROUND_OPEN, RankFault, _targets(S.REPORTING), h.on_fault,
         "reported (joins the report still pending); the controller opens or joins a round"),
    Rule(_states(S.REBUILDING), RankFault, _targets(S.REBUILDING), h.on_fault_rebuilding,
         "its group was re-forming: that recover fails (GroupFailed reports it); a survivor that ended stuck "
         "(exit 75) is started again into the group instead, once"),
    Rule(_states(S.DEGRADED), RankFault, _targets(S.RESTARTING, S.ENDED), h.on_fault_degraded,
         "every rank restarted locally; ENDED when the budget (counted on from the controller's) is spent"),
    # the controller, or its absence
    Rule(ANY - {S.STANDBY}, ReportSettled, _targets(S.STOPPING, S.RESTARTING, S.ENDED, UNCHANGED),
         h.on_report_settled, "taken: STOPPING (REPORTING only); not taken within the controller timeout: degraded "
         "(RESTARTING), or ENDED for a multi-node job"),
    Rule(_states(S.STOPPING, S.REBUILDING), ControllerLost, _targets(S.RESTARTING, S.ENDED), h.on_controller_lost,
         "the round waits on a controller gone for the controller timeout: degraded, or ENDED for a multi-node job "
         "(REPORTING has its report's own deadline)"),
    Rule(ORDERED, StopOrder, _targets(S.STOPPING), h.on_stop,
         "this node's fault ranks stopped (a live rank paused in place is kept), stop complete reported"),
    Rule(_states(S.DEGRADED, S.REJOINING), StopOrder, _targets(UNCHANGED), h.on_stop,
         "the same; a replacement has nothing to stop and still waits for the strategy"),
    Rule(ORDERED | {S.DEGRADED, S.REJOINING}, StrategiesOrder, _targets(UNCHANGED), h.on_strategies,
         "reports what this node's ranks allow of the configured strategies"),
    Rule(ORDERED | {S.DEGRADED, S.REJOINING}, ChangeOrder, _targets(S.RESTARTING, S.REBUILDING, S.ENDED, UNCHANGED),
         h.on_change, "recover/job-rescheduling: RESTARTING; a live retry: REBUILDING; dump, exit: ENDED; "
         "another strategy: 406, unchanged"),
    Rule(ANY - {S.STANDBY}, DumpOrder, _targets(S.ENDED), h.on_dump, "healthy ranks save (bounded), then the job ends"),
    Rule(ANY - {S.STANDBY}, KillOrder, _targets(S.ENDED), h.on_kill, "every rank stopped, exit with the failing code"),
    Rule(_states(S.STANDBY), KillOrder, _targets(S.ENDED), h.on_standby_end, "a standby never needed: exit 0"),
    Rule(_states(S.STANDBY), ChangeOrder, _targets(S.ENDED, UNCHANGED), h.on_standby_end,
         "exit (the job ended): exit 0; another strategy is not for it"),
    Rule(ANY, FenceOrder, _targets(S.FENCED), h.on_fence,
         "declared lost and replaced: every rank killed, exit 1 naming what replaced it"),
    Rule(_states(S.STANDBY), AssignOrder, _targets(UNCHANGED), h.on_assign,
         "takes over the lost node's rank (TakeNode); its registration's outcome is the next event"),
    Rule(ANY - {S.STANDBY}, AssignOrder, _targets(UNCHANGED), h.on_assign_ignored, "not a standby: ignored"),
    Rule(_states(S.RUNNING, S.STANDBY), MigrateOrder, _targets(UNCHANGED), h.on_migrate,
         "a planned migration starts beside the round machine (StartMigration; agent/ranks/migration.py; a node's: "
         "agent/ranks/node_migration.py, a standby its successor)"),
    Rule(ANY - {S.RUNNING, S.STANDBY}, MigrateOrder, _targets(UNCHANGED), h.on_migrate_refused,
         "refused: a round or the job's end is under way here (reported to the controller)"),
    Rule(_states(S.STANDBY), SuccessorJoined, _targets(S.RUNNING), h.on_successor_joined,
         "a node migration's successor holds the node: its ranks already run (no start)"),
    Rule(_states(S.STANDBY), SuccessorGaveUp, _targets(UNCHANGED), h.on_successor_gave_up,
         "a node migration's successor that could not take the node: still a healthy spare, it waits again"),
    # a node's life: how it begins (after registering, or failing to), how it ends when no order ends it
    Rule(_states(S.RUNNING), BeganFirst, _targets(S.RUNNING), h.on_began_first,
         "registered as its node: every rank starts (StartJob)"),
    Rule(_states(S.RUNNING), BeganDegraded, _targets(S.DEGRADED), h.on_began_degraded,
         "no controller took a single-node job: every rank starts, faults are recovered locally"),
    Rule(_states(S.RUNNING, S.STANDBY), BeganReplacement, _targets(S.REJOINING), h.on_began_replacement,
         "registered for a lost node (a standby: the node assigned to it): no rank starts before the round's "
         "changeStrategy"),
    Rule(_states(S.RUNNING), BeganStandby, _targets(S.STANDBY), h.on_began_standby,
         "joined as a spare (--standby, or its node is held by a replacement): no node, no rank"),
    Rule(_states(S.STANDBY), JobSeen, _targets(S.ENDED, UNCHANGED), h.on_job_seen,
         "the job SUCCEEDED, FAILED, or its controller forgot it: not needed, exit 0"),
    Rule(_states(S.STANDBY), ControllerLost, _targets(S.ENDED), h.on_standby_lost,
         "no answer from the controller for the controller timeout: exit 1"),
    Rule(_states(S.REJOINING), RejoinOverdue, _targets(S.ENDED), h.on_rejoin_overdue,
         "no strategy within TASKD_NODE_REJOIN_TIMEOUT: no rank started, exit 1"),
    Rule(ANY - {S.STANDBY}, Signalled, _targets(S.ENDED), h.on_signalled,
         "SIGTERM or SIGINT: every rank stopped, exit 128 + the signal"),
    Rule(_states(S.STANDBY), Signalled, _targets(S.ENDED), h.on_standby_signalled,
         "stopped before it was needed: exit 1"),
    Rule(ANY, Ended, _targets(S.ENDED), h.on_ended,
         "every rank succeeded, or a step of the node's own failed (no controller, the join, the agent): exit "
         "with its code"),
    # what the launcher and the ranks' files say
    Rule(_states(S.RESTARTING), StartResult, _targets(S.REBUILDING, S.RESUMING, S.STOPPING, S.DEGRADED),
         h.on_started, "started: RESUMING (a live recover: REBUILDING until its group re-forms); failed: STOPPING "
         "(the controller chooses again); degraded: DEGRADED. Ranks already gone are the next events"),
    Rule(_states(S.REBUILDING), StartResult, _targets(S.REBUILDING, S.STOPPING), h.on_restarted_rebuilding,
         "a survivor that ended stuck in its broken group was started again into the group (not started: the "
         "recover fails, status 1 reported)"),
    Rule(_states(S.REBUILDING), GroupRejoined, _targets(S.RESUMING), h.on_rejoined,
         "every local rank rejoined: status 0 reported, the restart recorded"),
    Rule(UNREPORTED, GroupRejoined, _targets(UNCHANGED), h.on_rejoined_unreported,
         "a job-rescheduling's group re-formed (already reported)"),
    Rule(_states(S.REBUILDING), GroupFailed, _targets(S.STOPPING), h.on_group_failed,
         "status 1 (406 for a retry) reported: the controller tries its next strategy"),
    Rule(UNREPORTED, GroupFailed, _targets(S.RUNNING, UNCHANGED), h.on_group_failed_unreported,
         "logged; RESUMING gives up on seeing the resumption"),
    Rule(WITH_RANKS - {S.RESTARTING}, Resumed, _targets(S.RUNNING, UNCHANGED), h.on_resumed,
         "RESUMING: training resumed (or nothing can tell), the round is over, taskd's controller is told "
         "(ReportResumed); elsewhere only recorded"),
)


_NAMED = {ANY: "any (not terminal)", ANY - {S.STANDBY}: "any but STANDBY", ORDERED: "ORDERED (RUNNING, REPORTING, "
          "STOPPING, REBUILDING, RESUMING)", ORDERED | {S.DEGRADED, S.REJOINING}: "ORDERED, DEGRADED, REJOINING"}

TABLE = RuleTable(RULES, NodeState, EVENT_TYPES, _NAMED)  # checked at import: a pair claimed twice fails it
INDEX = TABLE.index
index_rules, find_rule, describe_table = TABLE.index_rules, TABLE.find, TABLE.describe

# ---------------------------------------------------------------------------- the table in the docs

DOC = DocBlock("agent-table", "taskd.agent.round.rules", "docs/architecture.md", "the agent's rule table",
               lambda: describe_table(markdown=True), description=__doc__.splitlines()[0], show=describe_table)
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

__all__ = ["BEGIN", "END", "INDEX", "RULES", "UNCHANGED", "NodeRule", "Rule", "TransitionError", "check_target",
           "describe_table", "find_rule", "index_rules", "main", "update_doc", "RoundMachine"]


class RoundMachine(NodeRound):
    """One node's recovery state. Drive it with `handle(event, now)`."""

    def handle(self, event: object, now: float) -> list[Action]:
        """Apply the table's rule for this event in the current state, check where it led, return the actions."""
        if self.state in TERMINAL:
            return []
        rule = find_rule(type(event), self.state)
        if rule is None:
            return [Note(logging.DEBUG, f"{type(event).__name__} in {self.state.value}: no rule, dropped")]
        out: list[Action] = []
        source = self.state
        target = rule.handler(self, event, now, out)
        check_target(rule, source, target)
        self.state = target
        return out

    @property
    def waits_on_controller(self) -> bool:
        """A round waits on the controller's next signal, which a lost controller never sends (the loss timer
        runs). A pending fault report has its own deadline instead."""
        return self.state in (NodeState.STOPPING, NodeState.REBUILDING)


__all__ = ["RoundMachine"]


if __name__ == "__main__":
    raise SystemExit(main())
