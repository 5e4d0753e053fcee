"""The controller's generation and restart count reach the agent as typed fields of its `Order`, parsed once in
`Order.of` from a changeStrategy's extraParams; anything but a non-negative int (hostile or ClusterD's) is None."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from taskd.agent.link.orders import Command, Order
from taskd.vocabulary import Action, SignalType


def change(extra_params: object) -> Order:
    sig = SimpleNamespace(uuid="job-1-7", signal_type=SignalType.CHANGE_STRATEGY, actions=[Action.CHANGE_STRATEGY],
                          fault_ranks={1: "1"}, strategy="recover", timeout=30, extra_params=extra_params)
    return Order.of(Command.CHANGE, sig)


def test_generation_and_restarts_are_read_from_extra_params() -> None:
    order = change('{"generation": 7, "restarts": 2}')
    assert (order.generation, order.restarts) == (7, 2)
    assert change('{"generation": 0, "restarts": 0}').generation == 0, "0 is a count, not a missing value"
    assert change('{"generation": 7, "restarts": 2, "round": 4}').round == 4  # named in ResumedRequest
    assert change('{"generation": 7, "round": "4"}').round is None and change('{"round": -1}').round is None


@pytest.mark.parametrize("extra_params", [
    "",  # ClusterD: nothing
    None,
    "not json",
    "[7, 2]",  # JSON, not an object
    '"generation"',
    '{"reason": "x"}',  # taskd's, another field
    '{"generation": "7", "restarts": "2"}',  # strings
    '{"generation": 7.0, "restarts": 2.5}',  # floats
    '{"generation": true, "restarts": false}',  # bools are ints in Python: refused
    '{"generation": -1, "restarts": -3}',  # negative
    '{"generation": null, "restarts": [1]}',
    '{"generation": {"n": 1}}',
    "[" * 100_000,  # nested past the parser's recursion limit
])
def test_hostile_or_missing_fields_are_none(extra_params: object) -> None:
    order = change(extra_params)
    assert order.generation is None and order.restarts is None


def test_reason_is_read_from_the_same_params() -> None:
    assert change('{"reason": "job ended", "generation": 3}').reason() == "job ended"
    assert change("not json").reason() == "" and change("[1]").reason() == ""


def test_a_field_stands_alone() -> None:
    order = change('{"generation": 4, "restarts": "two"}')
    assert (order.generation, order.restarts) == (4, None)
