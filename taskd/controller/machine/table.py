"""The transition table: for each event type and state, the one rule that handles it.

Rules mean what taskd/rule_table.py says (as in the agent's round table): a rule takes one event type in its
source states, at most one rule per (event type, state) pair, and its handler must land in one of its targets
or `TransitionError` is raised. `RULES` is checked when this module loads. An event no rule takes is answered
401 naming the states that would take it (timer and disconnect events are dropped; `late_answers` rules are
not named).

docs/controller.md embeds `describe_table(markdown=True)`; refresh it with
`python -m taskd.controller.machine.table --write docs/controller.md` (a test fails when it is stale).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskd import rule_table
from taskd.controller.machine import handlers as h
from taskd.controller.machine import resumed as rs
from taskd.controller.machine.events import (
    EVENT_TYPES,
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    AgentRegistered,
    FaultReported,
    JobInit,
    JoinDue,
    LastCallDue,
    MigrationReported,
    MigrationRequested,
    Outcome,
    PaceReported,
    RecoverStatusReported,
    RejoinDue,
    StandbyConnected,
    StandbyDisconnected,
    StopComplete,
    StrategiesReported,
    StreamEndedDue,
    Tick,
    TrainingResumed,
)
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import ACTIVE, ANY, LIVE, TERMINAL, Declined, JobState
from taskd.controller.nodes import migration as mg
from taskd.controller.nodes import node_loss as nl
from taskd.controller.nodes import resize as rz
from taskd.controller.nodes import standby as sb
from taskd.controller.nodes import stragglers as st
from taskd.doc_block import DocBlock
from taskd.rule_table import UNCHANGED, RuleTable, TransitionError, Unchanged, check_target

S = JobState
Handler = Callable[[Job, Any, float, Outcome], JobState | Declined]
Target = JobState | Unchanged


@dataclass(frozen=True)
class Rule(rule_table.Rule[JobState, Handler]):
    """A rule of a job's table; `late_answers` keeps it out of the states a 401 names."""

    # takes only answers to a phase already over (a client retry, a late confirmation): not named in a 401
    late_answers: bool = False


def _states(*states: JobState) -> frozenset[JobState]:
    return frozenset(states)


def _targets(*targets: Target) -> frozenset[Target]:
    return frozenset(targets)


RULES: tuple[Rule, ...] = (
    # job and agent lifecycle
    Rule(ANY, JobInit, _targets(S.RUNNING, UNCHANGED), h.on_init, "reset → RUNNING; join → unchanged"),
    Rule(ANY, AgentRegistered, _targets(UNCHANGED), h.on_register,
         "starts its loss clock until it subscribes (the job's first starts the join clock); 409 if another "
         "process's agent holds the node"),
    Rule(_states(S.RESUMING), AgentConnected, _targets(S.RESUMING, S.STOPPING, S.REJOINING), h.on_connected_resuming,
         "STOPPING (the round restarts) once every agent is back"),
    Rule(_states(S.FAILED), AgentConnected, _targets(S.FAILED), h.on_connected_failed,
         "`killMaster` to that agent unless it finished"),
    Rule(_states(S.REJOINING), AgentConnected, _targets(S.REJOINING, S.RECOVERING, S.FAILED),
         h.on_connected_rejoining, "decides once the last awaited replacement subscribed: `changeStrategy` to "
         "every agent, the replacements included"),
    Rule(_states(S.RUNNING), AgentConnected, _targets(UNCHANGED, S.RECOVERING, S.STOPPING), rz.on_connected_running,
         "as below; the agent of a node a downgrade left out grows the job back: `changeStrategy upgrade` to all; "
         "one absent since a MIN:MAX start opens a round that restarts every rank at the new size"),
    Rule(ANY - {S.RUNNING, S.RESUMING, S.FAILED, S.REJOINING}, AgentConnected, _targets(UNCHANGED), h.on_connected,
         "re-sends the signal the agent still owes; stops its loss clock; a node's replacement is awaited no more"),
    Rule(LIVE, AgentDisconnected, _targets(UNCHANGED), h.on_disconnected_live,
         "starts its loss clock unless it finished"),
    Rule(TERMINAL, AgentDisconnected, _targets(UNCHANGED), h.on_disconnected, "recorded; the job is over"),
    # standby agents (no node rank; taskd.controller.nodes.standby)
    Rule(ANY, StandbyConnected, _targets(UNCHANGED), sb.on_connected,
         "waits; takes an awaited node at once (`taskd.assignNode`); `changeStrategy exit` if the job ended"),
    Rule(ANY, StandbyDisconnected, _targets(UNCHANGED), sb.on_disconnected,
         "forgotten (no loss round); the node it was assigned goes to the next standby"),
    Rule(ANY, AgentFinished, _targets(S.SUCCEEDED, S.FAILED, UNCHANGED), h.on_finished,
         "SUCCEEDED when every node finished 0, FAILED on a non-zero exit, or when it finished while an undecided "
         "round awaits another node's rank"),
    Rule(ANY, PaceReported, _targets(UNCHANGED), st.on_pace,
         "judged against the job's other ranks: `straggler` / `straggler_cleared` recorded; no action taken"),
    Rule(ANY, TrainingResumed, _targets(UNCHANGED), rs.on_training_resumed,
         "counted for the round recovering or last recovered (401 for another); `round_training_resumed` once "
         "its last node said so; no action taken"),
    Rule(ANY, MigrationRequested, _targets(UNCHANGED), mg.on_migrate,
         "`taskd migrate`: `taskd.migrate` to the rank's agent if the job is RUNNING on one node and its agent is "
         "connected, else refused (nothing sent); no round, no restart charged"),
    Rule(ANY, MigrationReported, _targets(UNCHANGED), mg.on_migrated,
         "the agent's account: `migrated` (pids, step, pause) or `migration_failed` (why) recorded; no action"),
    # an agent lost (silent past the loss timeout, or its stream ended past the grace) opens a node-loss round
    Rule(ACTIVE, AgentLossDue, _targets(S.STOPPING, S.COLLECTING, S.REJOINING, S.FAILED, UNCHANGED),
         nl.on_agent_lost, "fences it; opens (or widens) a node-loss round for its node's ranks; FAILED when a "
         "node already finished; unchanged if it came back"),
    Rule(ACTIVE, StreamEndedDue, _targets(S.STOPPING, S.COLLECTING, S.REJOINING, S.FAILED, UNCHANGED),
         nl.on_agent_lost, "as AgentLossDue, for a stream that ended and did not come back within the grace"),
    Rule(ACTIVE, RejoinDue, _targets(S.FAILED, S.RECOVERING, UNCHANGED), rz.on_rejoin_timeout,
         "no replacement came in time: `changeStrategy downgrade` (RECOVERING) if the job opted in to go on with "
         "fewer nodes and may; else FAILED (`changeStrategy exit` saying how to add a node)"),
    # nodes that never registered within the join timeout of the first agent fail the job
    Rule(ACTIVE, JoinDue, _targets(S.FAILED, UNCHANGED), h.on_join_timeout,
         "FAILED (`changeStrategy exit` to the agents that joined); unchanged once every node registered"),
    # a `--nnodes MIN:MAX` job's last call: it starts with the nodes present
    Rule(_states(S.RUNNING), LastCallDue, _targets(UNCHANGED), rz.start_smaller,
         "the missing nodes become absent; each that joins later grows the job (job-rescheduling, uncharged)"),
    # a fault opens a round, joins an undecided one, or waits for the next
    Rule(_states(S.RUNNING), FaultReported, _targets(S.STOPPING, S.FAILED), h.on_fault_running,
         "opens a round; FAILED when a node already finished"),
    Rule(_states(S.STOPPING, S.COLLECTING, S.RESUMING, S.REJOINING), FaultReported, _targets(S.STOPPING, UNCHANGED),
         h.on_fault_merge, "merged: `stopTrain` again (RESUMING waits); unchanged if nothing new"),
    Rule(_states(S.RECOVERING), FaultReported, _targets(S.RECOVERING), h.on_fault_queue,
         "queued for the next round; joins a job-rescheduling whose node has not reported its status yet"),
    Rule(TERMINAL, FaultReported, _targets(UNCHANGED), h.on_fault_terminal, "401: no recovery for a finished job"),
    # the round: stop -> collect -> decide -> recover
    Rule(_states(S.STOPPING), StopComplete, _targets(S.STOPPING, S.COLLECTING, S.RECOVERING, S.REJOINING, S.FAILED),
         h.on_stop_complete, "COLLECTING once all confirmed (decides at once if nobody is left to ask)"),
    Rule(_states(S.COLLECTING, S.RECOVERING, S.REJOINING), StopComplete, _targets(UNCHANGED),
         h.on_repeated_stop_complete, "duplicate → 0, else 401", late_answers=True),
    Rule(_states(S.COLLECTING), StrategiesReported, _targets(S.COLLECTING, S.RECOVERING, S.REJOINING, S.FAILED),
         h.on_strategies, "decides once all reported (REJOINING while a lost node's replacement is awaited); "
         "FAILED if it chose exit"),
    Rule(_states(S.RECOVERING, S.REJOINING), StrategiesReported, _targets(UNCHANGED), h.on_repeated_strategies,
         "duplicate → 0, else 401", late_answers=True),
    Rule(_states(S.RECOVERING), RecoverStatusReported, _targets(S.RECOVERING, S.RUNNING, S.STOPPING, S.FAILED),
         rz.on_recover_status, "RUNNING once all confirmed (STOPPING for a queued fault; RECOVERING: an upgrade for "
         "an absent node's agent that came meanwhile); a failure tries the next strategy; FAILED after dump or when "
         "none is left"),
    Rule(_states(S.FAILED), RecoverStatusReported, _targets(S.FAILED), h.on_late_status, "confirms the exit/dump",
         late_answers=True),
    # deadlines
    Rule(_states(S.STOPPING), Tick, _targets(S.STOPPING, S.COLLECTING, S.RECOVERING, S.REJOINING, S.FAILED),
         h.on_tick_stopping,
         "stop timeout: on without the silent agents"),
    Rule(_states(S.COLLECTING), Tick, _targets(S.COLLECTING, S.RECOVERING, S.REJOINING, S.FAILED),
         h.on_tick_collecting, "strategy timeout: decides without the silent agents"),
    Rule(_states(S.RECOVERING), Tick, _targets(S.RECOVERING, S.FAILED), h.on_tick_recovering,
         "recover timeout: the next strategy, or FAILED"),
    Rule(_states(S.RESUMING), Tick, _targets(S.RESUMING, S.STOPPING, S.REJOINING), h.on_tick_resuming,
         "resume timeout: the round restarts with the agents back"),
)


_NAMED = {ANY: "any", LIVE: "LIVE (not terminal)", ACTIVE: "ACTIVE (LIVE, not RESUMING)", TERMINAL: "terminal"}

TABLE = RuleTable(RULES, JobState, EVENT_TYPES, _NAMED)  # checked at import: a pair claimed twice fails it
INDEX = TABLE.index
index_rules, find_rule, describe_table = TABLE.index_rules, TABLE.find, TABLE.describe


def accepting_states(event_type: type) -> list[JobState]:
    """The states in which `event_type` moves the job on (rules for late answers not counted)."""
    return [s for s in JobState
            if (rule := INDEX.get((event_type, s))) is not None and not rule.late_answers]


def refusal_info(job_id: str, state: JobState, event_type: type) -> str:
    """The 401 info for an event no rule takes in `state`."""
    accepting = [s.value for s in accepting_states(event_type)]
    expected = " or ".join(accepting) if accepting else "another state"
    return f"job {job_id} is {state.value}, not {expected} ({event_type.__name__} refused)"


# ---------------------------------------------------------------------------- the table in the docs

DOC = DocBlock("table", "taskd.controller.machine.table", "docs/controller.md", "the transition table",
               lambda: describe_table(markdown=True), description=__doc__.splitlines()[0], show=describe_table)
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

__all__ = ["BEGIN", "END", "INDEX", "RULES", "UNCHANGED", "Rule", "TransitionError", "accepting_states",
           "check_target", "describe_table", "find_rule", "index_rules", "main", "refusal_info", "update_doc"]

if __name__ == "__main__":
    raise SystemExit(main())
