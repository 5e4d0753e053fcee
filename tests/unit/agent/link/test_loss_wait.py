"""A survivor's console during a node-loss wait (issue 31, F10): one line when it starts, one every period while
it lasts, one when the round's strategy ends it; nothing for a round that awaits no node."""

from __future__ import annotations

import json
import logging

import pytest

from taskd.agent.link.node_loss import LossWait, awaited, every
from taskd.agent.link.orders import Command, Order


def order(command: Command, params: dict | None = None, strategy: str = "") -> Order:
    return Order(command, "u", "", (), {}, strategy, 0.0, json.dumps(params) if params else "")


WAIT = {"awaiting": [1], "rejoin_left": 55.0, "rejoin_timeout": 60}


def test_what_a_signal_announces() -> None:
    assert awaited(json.dumps(WAIT)).nodes == (1,)
    for bad in ("", "{}", "[1]", '{"awaiting": "x", "rejoin_left": 1, "rejoin_timeout": 2}', "{not json"):
        assert awaited(bad) is None
    assert (every(300), every(60), every(10)) == (30.0, 6.0, 5.0)


def test_the_wait_is_said_when_it_starts_while_it_lasts_and_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "taskd.agent")
    w = LossWait()
    w.on_order(order(Command.STOP, WAIT), 100.0, own_node=0)
    w.on_order(order(Command.STRATEGIES, {**WAIT, "rejoin_left": 54.0}), 101.0, own_node=0)  # the same wait
    assert [r.getMessage() for r in caplog.records] == [
        "node 1 lost: the round waits for a replacement (`taskd run --node-rank 1 ...` on a new host, or a `taskd "
        "run --standby`), at most 55s more (the controller's --node-rejoin-timeout is 60s)"]
    w.tick(105.0)
    assert len(caplog.records) == 1  # not yet: every 6 s
    w.tick(107.0)
    assert caplog.records[-1].getMessage() == "still waiting for a replacement of node 1: 7s so far, at most 48s more"
    w.on_order(order(Command.CHANGE, strategy="job-rescheduling"), 120.0)
    assert caplog.records[-1].getMessage() == ("the wait for a replacement of node 1 ended after 20.0s: "
                                               "changeStrategy job-rescheduling")
    count = len(caplog.records)
    w.tick(200.0)
    w.on_order(order(Command.STOP), 201.0)  # a round that awaits nobody
    w.on_order(order(Command.STOP, WAIT), 202.0, own_node=1)  # a replacement does not wait for itself
    assert len(caplog.records) == count and not w.waiting
