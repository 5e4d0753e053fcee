"""The executor table (agent/round/actions.py) mirrors the round machine's rules: every action type the machine can
emit has exactly one executor, checked when the module loads; a table with a gap, a double or a stranger fails."""

from __future__ import annotations

import pytest

from taskd.agent.round import events as ev
from taskd.agent.round.actions import EXECUTORS, executor_table


def test_every_action_type_has_exactly_one_executor() -> None:
    assert set(EXECUTORS) == set(ev.ACTION_TYPES)
    assert len(ev.ACTION_TYPES) == len(set(ev.ACTION_TYPES)) >= 17
    assert len(set(EXECUTORS.values())) == len(EXECUTORS), "one function per action type"


def _pairs() -> list[tuple[type, object]]:
    return list(EXECUTORS.items())


def test_an_action_with_no_executor_fails_the_table() -> None:
    pairs = [p for p in _pairs() if p[0] is not ev.TakeNode]
    with pytest.raises(TypeError, match=r"none for \['TakeNode'\]"):
        executor_table(tuple(pairs))  # type: ignore[arg-type]


def test_an_action_with_two_executors_fails_the_table() -> None:
    pairs = [*_pairs(), (ev.Note, EXECUTORS[ev.Finish])]
    with pytest.raises(TypeError, match=r"two executors for \['Note'\]"):
        executor_table(tuple(pairs))  # type: ignore[arg-type]


def test_an_executor_for_something_not_an_action_fails_the_table() -> None:
    pairs = [*_pairs(), (ev.RankFault, EXECUTORS[ev.Note])]
    with pytest.raises(TypeError, match=r"not actions: \['RankFault'\]"):
        executor_table(tuple(pairs))  # type: ignore[arg-type]
