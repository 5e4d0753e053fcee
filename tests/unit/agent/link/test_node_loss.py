"""The agent's node-loss mechanics: a standby's questions to its controller, an assignment's node rank, a
replacement's bound, fencing."""

from __future__ import annotations

import json

import pytest

from taskd.agent.link.node_loss import StandbyWatch, replacement_overdue
from taskd.agent.link.orders import Command, Order
from taskd.agent.round.events import ControllerLost, JobSeen


class Sig:
    def __init__(self, signal_type: str, strategy: str, extra: str) -> None:
        self.uuid, self.signal_type, self.actions, self.fault_ranks = "u1", signal_type, (), {}
        self.strategy, self.timeout, self.extra_params = strategy, 0, extra


def order(command: Command, extra: object = None, strategy: str = "", signal_type: str = "") -> Order:
    """As the link builds it from a signal (Order.of parses extraParams once)."""
    return Order.of(command, Sig(signal_type, strategy, json.dumps(extra) if extra is not None else ""))


def test_an_assignment_names_its_node_rank_in_extra_params() -> None:
    assert order(Command.ASSIGN, {"node_rank": 2}).node_rank == 2
    for bad in ({}, {"node_rank": -1}, {"node_rank": True}, {"node_rank": "1"}, [1]):
        assert order(Command.ASSIGN, bad).node_rank is None
    assert Order.of(Command.ASSIGN, Sig("", "", "{not json")).node_rank is None


class FakeLink:
    def __init__(self, states: list[str | None]) -> None:
        self.states, self.asked = list(states), 0

    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None:
        self.asked += 1
        state = self.states.pop(0) if self.states else None
        return (state, "") if state is not None else None


def test_a_standby_asks_its_jobs_state_once_a_second() -> None:
    now = [0.0]
    link = FakeLink(["RUNNING", "RUNNING", "SUCCEEDED"])
    watch = StandbyWatch(30.0, now[0])
    seen = []
    while now[0] < 5.0:
        if (event := watch.poll(link, lambda: now[0])) is not None:
            seen.append(event)
        now[0] += 0.25
    assert seen[:3] == [JobSeen("RUNNING"), JobSeen("RUNNING"), JobSeen("SUCCEEDED")]
    assert link.asked == 5 and watch.next_poll == pytest.approx(5.0), "asked at 0, 1, 2, 3, 4 s: no more often"


def test_a_standby_whose_controller_stops_answering_gives_up_after_the_controller_timeout() -> None:
    now = [0.0]
    watch = StandbyWatch(30.0, now[0])
    link = FakeLink(["RUNNING", "RUNNING"])  # two answers (at 0 and 1 s), then silence
    lost = None
    while lost is None and now[0] < 60.0:
        event = watch.poll(link, lambda: now[0])
        lost = event if isinstance(event, ControllerLost) else None
        now[0] += 0.5
    assert lost is not None and lost.lost_for == pytest.approx(30.0)
    assert 31.0 <= now[0] <= 32.0  # counted from the last answer, on the passed-in clock


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
    from taskd.agent.link.registration import PROBE_AFTER, Fencing
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
    from taskd.agent.link.registration import Fencing
    from taskd.vocabulary import Code

    orders: list[str] = []
    fencing = Fencing(orders.append)
    client = FakeClient(Code.OK)
    fencing.probe(client, connected=False, now=100.0, silent_for=40.0)  # SIGCONTed after 40 s: no wait
    fencing._probe.join(5)
    assert client.asked == 1 and fencing.fenced is None and orders == []
