"""A state machine's transitions as data: rules over (event type, state) pairs, checked when the table is built.

A rule is (source states, event type, target states, handler, note). At most one rule may claim an
(event type, state) pair (`index_rules` refuses a table where two do), so the order of a table's rules
means nothing. After a handler ran, its result must be one of its rule's targets, where `UNCHANGED` allows
the state the machine was in: `check_target` raises `TransitionError` for anything else.

The controller's job table (controller/machine/table.py) and the agent's round table (agent/round/rules.py) are
built on this: each keeps its own states, events, rules, named state sets and notes, and its own machine
that looks a rule up, runs the handler and checks where it landed. What a rule means, and how a table is
checked and printed, is written once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

StateT = TypeVar("StateT", bound=Enum)
HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])


class Unchanged(Enum):
    """A rule's target meaning "the state the machine was in", for rules with several source states."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


class TransitionError(AssertionError):
    """A handler moved its machine to a state its rule does not list: a bug in the handler or the table."""


@dataclass(frozen=True)
class Rule(Generic[StateT, HandlerT]):
    """In any of `sources`, an event of exactly type `event` runs `handler`, which lands in one of `targets`."""

    sources: frozenset[StateT]
    event: type
    targets: frozenset[StateT | Unchanged]
    handler: HandlerT
    note: str = ""  # what the targets mean, for the generated docs

    def allows(self, source: StateT, target: StateT) -> bool:
        return target in self.targets or (target == source and UNCHANGED in self.targets)


RuleT = TypeVar("RuleT", bound=Rule)


def index_rules(rules: Iterable[RuleT], event_types: Collection[type]) -> dict[tuple[type, Any], RuleT]:
    """{(event type, state): rule}; ValueError for an event not in `event_types`, or two rules claiming the
    same pair (their order would matter)."""
    index: dict[tuple[type, Any], RuleT] = {}
    for rule in rules:
        if rule.event not in event_types:
            raise ValueError(f"{rule.handler.__name__}: {rule.event!r} is not an event type")
        for state in rule.sources:
            other = index.setdefault((rule.event, state), rule)
            if other is not rule:
                raise ValueError(f"{rule.event.__name__} in {state.value} is claimed by both "
                                 f"{other.handler.__name__} and {rule.handler.__name__}")
    return index


def check_target(rule: Rule[StateT, Any], source: StateT, target: StateT) -> None:
    """Raise `TransitionError` unless the table lets `rule` move its machine from `source` to `target`."""
    if not rule.allows(source, target):
        raise TransitionError(f"{rule.handler.__name__} moved {source.value} to {target.value}, "
                              f"table allows {format_targets(rule.targets, type(source))}")


# ---------------------------------------------------------------------------- a table as text


def format_sources(sources: frozenset[StateT], states: type[StateT], named: Mapping[frozenset, str]) -> str:
    """A rule's sources: the table's name for the set if it has one, else its states in declaration order."""
    return named.get(sources) or ", ".join(s.value for s in states if s in sources)


def format_targets(targets: frozenset[Any], states: type[Enum]) -> str:
    """A rule's targets in declaration order, `unchanged` last."""
    names = [s.value for s in states if s in targets]
    return ", ".join(names + (["unchanged"] if UNCHANGED in targets else []))


def describe_rules(rules: Sequence[Rule[StateT, Any]], states: type[StateT], named: Mapping[frozenset, str],
                   markdown: bool = False) -> str:
    """The table, one line per rule: as text (handy in a debugger) or as the Markdown of the docs."""
    if markdown:
        rows = ["| source | event | targets | handler | what happens |", "| --- | --- | --- | --- | --- |"]
        rows += [f"| {format_sources(r.sources, states, named)} | {r.event.__name__} | "
                 f"{format_targets(r.targets, states)} | `{r.handler.__name__}` | {r.note} |" for r in rules]
    else:
        width = max(len(format_sources(r.sources, states, named)) for r in rules)
        event_width = max(len(r.event.__name__) for r in rules) + 1
        rows = [f"{format_sources(r.sources, states, named):<{width}}  {r.event.__name__:<{event_width}} -> "
                f"{format_targets(r.targets, states):<40} {r.handler.__name__}" for r in rules]
    return "\n".join(rows)


class RuleTable(Generic[StateT, RuleT]):
    """One machine's rules with what checking and printing them needs: its states in declaration order, its
    event types, and its names for the state sets its rules use. Built at import, so a bad table fails there."""

    def __init__(self, rules: Iterable[RuleT], states: type[StateT], event_types: Collection[type],
                 named: Mapping[frozenset, str] | None = None) -> None:
        self.rules = tuple(rules)
        self.states = states
        self.event_types = event_types
        self.named = dict(named or {})
        self.index = self.index_rules(self.rules)

    def index_rules(self, rules: Iterable[RuleT]) -> dict[tuple[type, StateT], RuleT]:
        """{(event type, state): rule}; ValueError if two rules claim the same pair (order would matter)."""
        return index_rules(rules, self.event_types)

    def find(self, event_type: type, state: StateT) -> RuleT | None:
        return self.index.get((event_type, state))

    def describe(self, markdown: bool = False) -> str:
        """The table, one line per rule: as text (handy in a debugger) or as the Markdown of the docs."""
        return describe_rules(self.rules, self.states, self.named, markdown)
