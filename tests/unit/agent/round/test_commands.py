"""The controller's signals become typed orders, and every order has a handler (an explicit table)."""

from __future__ import annotations

from types import SimpleNamespace

from taskd.agent.link.orders import WIRE_COMMANDS, Command, Order
from taskd.agent.round.events import ORDER_EVENTS
from taskd.agent.round.rules import RULES
from taskd.vocabulary import Action, SignalType


def signal(**kw: object) -> SimpleNamespace:
    base = dict(uuid="u1", signal_type=SignalType.STOP_TRAIN, actions=[Action.STOP_TRAIN], fault_ranks={3: 1},
                strategy="", timeout=0, extra_params="")
    return SimpleNamespace(**{**base, **kw})


def test_every_command_has_an_event_a_rule_and_a_wire_name() -> None:
    assert set(ORDER_EVENTS) == set(Command)
    for command, event in ORDER_EVENTS.items():
        assert any(rule.event is event for rule in RULES), f"no rule takes {command.value}"
    assert set(WIRE_COMMANDS.values()) == set(Command)  # taskd.fenced and taskd.assignNode too (issue 17)


def test_order_carries_fault_ranks_as_the_one_type() -> None:
    order = Order.of(Command.STOP, signal(fault_ranks={3: 1, 5: "0"}))
    assert order.fault_ranks == {3: "1", 5: "0"}
    assert order.command is Command.STOP and order.timeout == 0.0


def test_order_reason_reads_taskd_extra_params_only() -> None:
    assert Order.of(Command.KILL, signal(extra_params='{"reason": "agent of node 1 lost"}')).reason() == \
        "agent of node 1 lost"
    assert Order.of(Command.KILL, signal(extra_params="not json")).reason() == ""
    assert Order.of(Command.KILL, signal(extra_params="[1]")).reason() == ""
