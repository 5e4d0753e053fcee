"""The transition table: for each event type and state, the one rule that handles it.

A rule is (source states, event type, target states, handler, note). At most one rule matches an
(event type, state) pair (checked when this module loads), so the order of `RULES` means nothing.
After the handler ran, its result must be one of the rule's targets, where `UNCHANGED` allows the
state the job was in: a handler landing anywhere else raises `TransitionError`. An event no rule takes
is answered 401 naming the states that would take it (timer and disconnect events are dropped).

docs/controller.md embeds `describe_table(markdown=True)`; refresh it with
`python -m taskd.controller.table --write docs/controller.md` (a test fails when it is stale).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from taskd.controller import handlers as h
from taskd.controller import node_loss as nl
from taskd.controller.events import (
    EVENT_TYPES,
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    AgentRegistered,
    FaultReported,
    JobInit,
    JoinDue,
    Outcome,
    RecoverStatusReported,
    RejoinDue,
    StopComplete,
    StrategiesReported,
    StreamEndedDue,
    Tick,
)
from taskd.controller.job import Job
from taskd.controller.model import ACTIVE, ANY, LIVE, TERMINAL, Declined, JobState

S = JobState


class Unchanged(Enum):
    """A rule's target meaning "the state the job was in", for rules with several source states."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED
Target = JobState | Unchanged
Handler = Callable[[Job, Any, float, Outcome], JobState | Declined]


class TransitionError(AssertionError):
    """A handler moved a job to a state its rule does not list: a bug in the handler or the table."""


@dataclass(frozen=True)
class Rule:
    sources: frozenset[JobState]
    event: type
    targets: frozenset[Target]
    handler: Handler
    note: str = ""  # what the targets mean, for docs/controller.md
    # takes only answers to a phase already over (a client retry, a late confirmation): not named in a 401
    late_answers: bool = False

    def allows(self, source: JobState, target: JobState) -> bool:
        return target in self.targets or (target == source and UNCHANGED in self.targets)


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
    Rule(ANY - {S.RESUMING, S.FAILED, S.REJOINING}, AgentConnected, _targets(UNCHANGED), h.on_connected,
         "re-sends the signal the agent still owes; stops its loss clock; a node's replacement is awaited no more"),
    Rule(LIVE, AgentDisconnected, _targets(UNCHANGED), h.on_disconnected_live,
         "starts its loss clock unless it finished"),
    Rule(TERMINAL, AgentDisconnected, _targets(UNCHANGED), h.on_disconnected, "recorded; the job is over"),
    Rule(ANY, AgentFinished, _targets(S.SUCCEEDED, S.FAILED, UNCHANGED), h.on_finished,
         "SUCCEEDED when every node finished 0, FAILED on a non-zero exit"),
    # an agent lost (silent past the loss timeout, or its stream ended past the grace) opens a node-loss round
    Rule(ACTIVE, AgentLossDue, _targets(S.STOPPING, S.COLLECTING, S.REJOINING, S.FAILED, UNCHANGED),
         nl.on_agent_lost, "fences it; opens (or widens) a node-loss round for its node's ranks; FAILED when a "
         "node already finished; unchanged if it came back"),
    Rule(ACTIVE, StreamEndedDue, _targets(S.STOPPING, S.COLLECTING, S.REJOINING, S.FAILED, UNCHANGED),
         nl.on_agent_lost, "as AgentLossDue, for a stream that ended and did not come back within the grace"),
    Rule(ACTIVE, RejoinDue, _targets(S.FAILED, UNCHANGED), nl.on_rejoin_timeout,
         "FAILED (`changeStrategy exit` saying how to add a node) when no replacement came in time"),
    # nodes that never registered within the join timeout of the first agent fail the job
    Rule(ACTIVE, JoinDue, _targets(S.FAILED, UNCHANGED), h.on_join_timeout,
         "FAILED (`changeStrategy exit` to the agents that joined); unchanged once every node registered"),
    # a fault opens a round, joins an undecided one, or waits for the next
    Rule(_states(S.RUNNING), FaultReported, _targets(S.STOPPING, S.FAILED), h.on_fault_running,
         "opens a round; FAILED when a node already finished"),
    Rule(_states(S.STOPPING, S.COLLECTING, S.RESUMING, S.REJOINING), FaultReported, _targets(S.STOPPING, UNCHANGED),
         h.on_fault_merge, "merged: `stopTrain` again (RESUMING waits); unchanged if nothing new"),
    Rule(_states(S.RECOVERING), FaultReported, _targets(S.RECOVERING), h.on_fault_queue, "queued for the next round"),
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
         h.on_recover_status, "RUNNING once all confirmed (STOPPING for a queued fault); a failure tries the next "
         "strategy; FAILED after dump or when none is left"),
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


def index_rules(rules: Iterable[Rule]) -> dict[tuple[type, JobState], Rule]:
    """{(event type, state): rule}; ValueError if two rules claim the same pair (order would matter)."""
    index: dict[tuple[type, JobState], Rule] = {}
    for rule in rules:
        if rule.event not in EVENT_TYPES:
            raise ValueError(f"{rule.handler.__name__}: {rule.event!r} is not an event type")
        for state in rule.sources:
            other = index.setdefault((rule.event, state), rule)
            if other is not rule:
                raise ValueError(f"{rule.event.__name__} in {state.value} is claimed by both "
                                 f"{other.handler.__name__} and {rule.handler.__name__}")
    return index


INDEX = index_rules(RULES)


def find_rule(event_type: type, state: JobState) -> Rule | None:
    return INDEX.get((event_type, state))


def check_target(rule: Rule, source: JobState, target: JobState) -> None:
    """Raise `TransitionError` unless the table lets `rule` move a job from `source` to `target`."""
    if not rule.allows(source, target):
        raise TransitionError(f"{rule.handler.__name__} moved {source.value} to {target.value}, "
                              f"table allows {_fmt_targets(rule.targets)}")


def accepting_states(event_type: type) -> list[JobState]:
    """The states in which `event_type` moves the job on (rules for late answers not counted)."""
    return [s for s in JobState
            if (rule := INDEX.get((event_type, s))) is not None and not rule.late_answers]


def refusal_info(job_id: str, state: JobState, event_type: type) -> str:
    """The 401 info for an event no rule takes in `state`."""
    accepting = [s.value for s in accepting_states(event_type)]
    expected = " or ".join(accepting) if accepting else "another state"
    return f"job {job_id} is {state.value}, not {expected} ({event_type.__name__} refused)"


# ---------------------------------------------------------------------------- the table as text

_NAMED = {ANY: "any", LIVE: "LIVE (not terminal)", ACTIVE: "ACTIVE (LIVE, not RESUMING)", TERMINAL: "terminal"}


def _fmt_sources(sources: frozenset[JobState]) -> str:
    return _NAMED.get(sources) or ", ".join(s.value for s in JobState if s in sources)


def _fmt_targets(targets: frozenset[Target]) -> str:
    names = [s.value for s in JobState if s in targets]
    return ", ".join(names + (["unchanged"] if UNCHANGED in targets else []))


def describe_table(markdown: bool = False) -> str:
    """The transition table, one line per rule: as text (handy in a debugger) or as the Markdown of the docs."""
    if markdown:
        rows = ["| source | event | targets | handler | what happens |", "| --- | --- | --- | --- | --- |"]
        rows += [f"| {_fmt_sources(r.sources)} | {r.event.__name__} | {_fmt_targets(r.targets)} | "
                 f"`{r.handler.__name__}` | {r.note} |" for r in RULES]
    else:
        width = max(len(_fmt_sources(r.sources)) for r in RULES)
        rows = [f"{_fmt_sources(r.sources):<{width}}  {r.event.__name__:<22} -> {_fmt_targets(r.targets):<40} "
                f"{r.handler.__name__}" for r in RULES]
    return "\n".join(rows)


BEGIN = "<!-- table:begin (generated by `python -m taskd.controller.table --write docs/controller.md`) -->"
END = "<!-- table:end -->"


def update_doc(text: str) -> str:
    """`text` with the table between its BEGIN and END markers replaced by the current one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the table markers are missing; put {BEGIN!r} and {END!r} on lines of their own")
    return text[:start] + BEGIN + "\n" + describe_table(markdown=True) + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taskd.controller.table", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="DOC", type=Path, help="refresh the table between the markers of DOC")
    group.add_argument("--check", metavar="DOC", type=Path, help="exit 1 if the table in DOC is out of date")
    args = parser.parse_args(argv)
    doc = args.write or args.check
    if doc is None:
        sys.stdout.write(describe_table() + "\n")
        return 0
    text = doc.read_text(encoding="utf-8")
    fresh = update_doc(text)
    if args.check:
        if fresh != text:
            sys.stderr.write(f"{doc}: the transition table is out of date; run {parser.prog} --write {doc}\n")
            return 1
        return 0
    if fresh != text:
        doc.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
