"""The agent's node-loss decisions: a standby's wait, an assignment's node rank, a replacement's bound."""

from __future__ import annotations

import json

from taskd.agent.node_loss import assigned_node, await_assignment, replacement_overdue, standby_step
from taskd.agent.orders import Command, Order
from taskd.vocabulary import SignalType, Strategy


class Sig:
    def __init__(self, signal_type: str, strategy: str, extra: str) -> None:
        self.uuid, self.signal_type, self.actions, self.fault_ranks = "u1", signal_type, (), {}
        self.strategy, self.timeout, self.extra_params = strategy, 0, extra


def order(command: Command, extra: object = None, strategy: str = "", signal_type: str = "") -> Order:
    """As the link builds it from a signal (Order.of parses extraParams once)."""
    return Order.of(command, Sig(signal_type, strategy, json.dumps(extra) if extra is not None else ""))


def test_an_assignment_names_its_node_rank_in_extra_params() -> None:
    assert assigned_node(order(Command.ASSIGN, {"node_rank": 2})) == 2
    for bad in ({}, {"node_rank": -1}, {"node_rank": True}, {"node_rank": "1"}, [1]):
        assert assigned_node(order(Command.ASSIGN, bad)) is None
    assert assigned_node(Order.of(Command.ASSIGN, Sig("", "", "{not json"))) is None


def test_a_standby_waits_until_assigned_or_the_job_ends() -> None:
    assert standby_step(None, None) is None and standby_step(None, "RUNNING") is None
    assert standby_step(order(Command.ASSIGN, {"node_rank": 1}), "RUNNING").node_rank == 1
    assert standby_step(order(Command.ASSIGN, {}), None) is None  # names no node: keep waiting
    ended = standby_step(order(Command.CHANGE, {"reason": "job ended"}, Strategy.EXIT), None)
    assert ended is not None and not ended.needed and ended.why == "job ended" and ended.detail == "job ended"
    killed = standby_step(order(Command.KILL, signal_type=SignalType.KILL_MASTER), None)
    assert killed is not None and killed.why == "job ended" and killed.detail == SignalType.KILL_MASTER
    assert standby_step(None, "SUCCEEDED").why == "job ended" and standby_step(None, "FAILED").why == "job ended"
    assert standby_step(None, "").detail == "the controller no longer knows the job"
    fenced = standby_step(order(Command.FENCE, {"reason": "node 1 is now held by h:2"}), None)
    assert fenced.why == "fenced" and "h:2" in fenced.detail
    assert standby_step(order(Command.STOP), "RUNNING") is None  # a round's signal is not a standby's


class FakeLink:
    def __init__(self, orders: list[Order | None], states: list[str]) -> None:
        self.orders, self.states, self.asked = list(orders), list(states), 0

    def next_order(self) -> Order | None:
        return self.orders.pop(0) if self.orders else None

    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None:
        self.asked += 1
        return (self.states.pop(0), "") if self.states else None


def test_await_assignment_asks_the_job_state_once_a_second_and_reads_every_order() -> None:
    now = [0.0]
    link = FakeLink([None, None, order(Command.STOP), order(Command.ASSIGN, {"node_rank": 3})], ["RUNNING"] * 10)
    end = await_assignment(link, lambda s: now.__setitem__(0, now[0] + max(s, 0.5)), lambda: False, lambda: now[0])
    assert end.node_rank == 3 and link.asked <= 3
    now[0] = 0.0
    end = await_assignment(FakeLink([], ["RUNNING", "RUNNING", "SUCCEEDED"]),
                           lambda s: now.__setitem__(0, now[0] + s), lambda: False, lambda: now[0])
    assert end.why == "job ended" and now[0] >= 2.0
    end = await_assignment(FakeLink([], ["RUNNING"] * 5), lambda s: None, lambda: True, lambda: 0.0)
    assert end.why == "signal"


def test_a_standby_whose_controller_stops_answering_gives_up_after_the_controller_timeout() -> None:
    now = [0.0]
    link = FakeLink([], ["RUNNING", "RUNNING"])  # two answers, then silence
    end = await_assignment(link, lambda s: now.__setitem__(0, now[0] + max(s, 0.5)), lambda: False, lambda: now[0],
                           silence=30.0)
    assert end.why == "controller lost" and not end.needed and "30s" in end.detail
    assert 30.0 <= now[0] <= 33.0  # counted from the last answer (at ~1 s), on the passed-in clock


def test_a_replacement_gives_up_after_the_rejoin_timeout() -> None:
    assert not replacement_overdue(None, 1000.0, 300.0)
    assert not replacement_overdue(10.0, 309.9, 300.0) and replacement_overdue(10.0, 310.0, 300.0)


class FakeClient:
    def __init__(self, code: int) -> None:
        self.code, self.asked = code, 0

    def register(self, timeout: float = 0.0) -> object:
        self.asked += 1
        return type("Status", (), {"code": self.code, "info": "node 1 is now held by host-b:42"})()


def test_a_cut_off_agent_asks_whether_it_was_fenced_and_fences_once() -> None:
    from taskd.agent.fencing import PROBE_AFTER, Fencing
    from taskd.vocabulary import Code

    orders: list[str] = []
    fencing = Fencing(orders.append)
    client = FakeClient(Code.FENCED)
    fencing.probe(client, connected=True, now=0.0)
    fencing.probe(client, connected=False, now=1.0)  # just lost its stream: not yet
    assert client.asked == 0
    fencing.probe(client, connected=False, now=1.0 + PROBE_AFTER)
    fencing._probe.join(5)
    assert client.asked == 1 and fencing.fenced == "node 1 is now held by host-b:42"
    assert [json.loads(o)["reason"] for o in orders] == ["node 1 is now held by host-b:42"]
    fencing.fence("again")  # any later word of it changes nothing
    assert len(orders) == 1


def test_an_agent_that_was_stopped_asks_at_once_and_a_healthy_one_stays() -> None:
    from taskd.agent.fencing import Fencing
    from taskd.vocabulary import Code

    orders: list[str] = []
    fencing = Fencing(orders.append)
    client = FakeClient(Code.OK)
    fencing.probe(client, connected=False, now=100.0, silent_for=40.0)  # SIGCONTed after 40 s: no wait
    fencing._probe.join(5)
    assert client.asked == 1 and fencing.fenced is None and orders == []
