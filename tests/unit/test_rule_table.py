"""taskd/rule_table.py on a table of its own (a door): the checks and the printing that the controller's and the
agent's tables share. No process, no network."""

from __future__ import annotations

from enum import Enum
from typing import Any

import pytest

from taskd.rule_table import UNCHANGED, Rule, RuleTable, TransitionError, check_target, format_targets, index_rules


class Door(Enum):
    OPEN = "OPEN"
    CLOSED = "CLOSED"
    LOCKED = "LOCKED"


class Push:
    pass


class Lock:
    pass


def close(door: Any, event: Any) -> Door:
    return Door.CLOSED


def stay(door: Any, event: Any) -> Door:
    return door


ANY_DOOR = frozenset(Door)
RULES = (
    Rule(frozenset({Door.OPEN}), Push, frozenset({Door.CLOSED}), close, "closes it"),
    Rule(frozenset({Door.CLOSED, Door.LOCKED}), Push, frozenset({UNCHANGED}), stay, "nothing moves"),
    Rule(ANY_DOOR, Lock, frozenset({Door.LOCKED, UNCHANGED}), stay),
)


def test_the_index_has_one_rule_per_event_and_state_whatever_the_order() -> None:
    table = RuleTable(RULES, Door, (Push, Lock), {ANY_DOOR: "any door"})
    assert len(table.index) == sum(len(r.sources) for r in RULES) == 6
    assert table.index_rules(reversed(RULES)) == table.index
    assert table.find(Push, Door.OPEN) is RULES[0] and table.find(Push, Door.LOCKED) is RULES[1]
    assert table.find(int, Door.OPEN) is None


def test_a_pair_claimed_twice_or_an_unknown_event_refuses_the_table() -> None:
    twice = (*RULES, Rule(frozenset({Door.LOCKED}), Push, frozenset({Door.OPEN}), close))
    with pytest.raises(ValueError, match="Push in LOCKED is claimed by both stay and close"):
        RuleTable(twice, Door, (Push, Lock))
    with pytest.raises(ValueError, match="close: <class 'int'> is not an event type"):
        index_rules([Rule(frozenset({Door.OPEN}), int, frozenset({Door.OPEN}), close)], (Push, Lock))


def test_a_handler_landing_outside_its_targets_raises_and_unchanged_means_the_state_it_was_in() -> None:
    check_target(RULES[0], Door.OPEN, Door.CLOSED)
    with pytest.raises(TransitionError, match="close moved OPEN to LOCKED, table allows CLOSED"):
        check_target(RULES[0], Door.OPEN, Door.LOCKED)
    check_target(RULES[1], Door.LOCKED, Door.LOCKED)
    with pytest.raises(TransitionError, match="stay moved LOCKED to CLOSED, table allows unchanged"):
        check_target(RULES[1], Door.LOCKED, Door.CLOSED)
    assert RULES[2].allows(Door.OPEN, Door.LOCKED) and RULES[2].allows(Door.OPEN, Door.OPEN)
    assert not RULES[2].allows(Door.OPEN, Door.CLOSED)


def test_the_table_prints_states_in_declaration_order_named_sets_by_their_name() -> None:
    table = RuleTable(RULES, Door, (Push, Lock), {ANY_DOOR: "any door"})
    assert format_targets(frozenset({UNCHANGED, Door.LOCKED, Door.OPEN}), Door) == "OPEN, LOCKED, unchanged"
    assert table.describe(markdown=True).splitlines() == [
        "| source | event | targets | handler | what happens |",
        "| --- | --- | --- | --- | --- |",
        "| OPEN | Push | CLOSED | `close` | closes it |",
        "| CLOSED, LOCKED | Push | unchanged | `stay` | nothing moves |",
        "| any door | Lock | LOCKED, unchanged | `stay` |  |",
    ]
    assert table.describe().splitlines() == [  # sources padded to the widest, events to the longest name + 1
        "OPEN            Push  -> CLOSED" + " " * 35 + "close",
        "CLOSED, LOCKED  Push  -> unchanged" + " " * 32 + "stay",
        "any door        Lock  -> LOCKED, unchanged" + " " * 24 + "stay",
    ]
