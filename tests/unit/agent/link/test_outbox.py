"""The agent's reports as pending items its loop polls (agent/link/reports.py): one attempt at a time, never a wait,
re-sent on the retry policy's timer, settled at their deadline; the clock is passed in. The client is a stand-in
that records what it was asked and answers when the test says (the real RPC path runs in the e2e tests)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from taskd.agent.link.report_policy import FAULT, RESUMED, STOP_COMPLETE, STRATEGIES, ReportKind, ReportRetry
from taskd.agent.link.reports import Outbox, Report
from taskd.client.errors import ServerUnreachable
from taskd.vocabulary import Code

TIMEOUT = 30.0


class Call:
    """An RPC in flight, completed by the test."""

    def __init__(self, method: str, request: Any, timeout: float) -> None:
        self.method, self.request, self.timeout = method, request, timeout
        self.answer: int | None = None
        self.error: Exception | None = None
        self.cancelled = False

    def done(self) -> bool:
        return self.answer is not None or self.error is not None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return SimpleNamespace(code=self.answer, info=f"info of {self.answer}")

    def cancel(self) -> None:
        self.cancelled = True


class Client:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.resyncs: list[bool] = []

    def start_report(self, method: str, request: Any, *, timeout: float, on_done: Any = None) -> Call:
        self.calls.append(Call(method, request, timeout))
        return self.calls[-1]

    def resync(self, *, reinit: bool, timeout: float) -> int:
        self.resyncs.append(reinit)
        return 0

    @property
    def last(self) -> Call:
        return self.calls[-1]


def fault_report(now: float, faults: dict[int, str] | None = None) -> Report:
    retry = ReportRetry(now + TIMEOUT)
    return Report(FAULT, lambda _c, r: dict(r.faults), retry, dict(faults or {1: "1"}), "rank 1")


def report(kind: ReportKind, now: float) -> Report:
    return Report(kind, lambda _c, _r: kind.what, ReportRetry(now + TIMEOUT))


@pytest.fixture
def box() -> tuple[Outbox, Client]:
    client = Client()
    return Outbox(lambda: client, lambda: None, clock=lambda: 0.0), client


def test_a_report_is_sent_at_once_and_settles_when_taken(box: tuple[Outbox, Client]) -> None:
    outbox, client = box
    outbox.add(fault_report(0.0))
    assert outbox.poll(0.0) == [] and len(client.calls) == 1, "one attempt started, nothing waited for"
    assert client.last.timeout == 5.0, "an attempt's deadline is short, whatever the report's"
    assert outbox.poll(0.5) == [], "no answer yet: nothing settles, nothing is re-sent"
    client.last.answer = Code.OK
    [settled] = outbox.poll(0.6)
    assert settled.taken and settled.report.kind is FAULT and len(outbox) == 0


def test_an_unreachable_controller_settles_the_fault_report_at_the_controller_timeout(
        box: tuple[Outbox, Client]) -> None:
    """Degraded mode starts at TASKD_CONTROLLER_TIMEOUT: not before, not a call deadline or two after."""
    outbox, client = box
    outbox.add(fault_report(100.0))
    started: dict[int, float] = {}
    now, settled = 100.0, []
    while not settled:  # every attempt fails at its own deadline (wait_for_ready on a port nobody listens on)
        settled = outbox.poll(now)
        for i in range(len(client.calls)):
            started.setdefault(i, now)
        call = client.last
        if not call.done() and now >= started[len(client.calls) - 1] + call.timeout:
            call.error = ServerUnreachable("127.0.0.1:1", "DEADLINE_EXCEEDED")
        now = round(now + 0.05, 2)
    [fault] = settled
    assert not fault.taken and "deadline" in fault.why
    assert now - 0.05 == pytest.approx(100.0 + TIMEOUT), "settled exactly at the controller timeout"
    assert outbox.wake_at() is None
    assert all(c.timeout <= 5.0 for c in client.calls) and len(client.calls) >= 6, "re-sent all along"


def test_a_call_in_flight_at_the_deadline_is_cancelled(box: tuple[Outbox, Client]) -> None:
    outbox, client = box
    outbox.add(fault_report(0.0))
    outbox.poll(0.0)
    assert outbox.wake_at() == TIMEOUT, "an attempt in flight: the loop's next wake is the deadline"
    [settled] = outbox.poll(TIMEOUT)
    assert not settled.taken and client.last.cancelled


def test_a_503_is_retried_and_says_the_controller_could_not_store_it(box: tuple[Outbox, Client],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    outbox, client = box
    outbox.add(fault_report(0.0))
    outbox.poll(0.0)
    client.last.answer = Code.STORAGE_ERROR
    with caplog.at_level(logging.WARNING, "taskd.agent"):
        assert outbox.poll(0.01) == []
    assert "fault report not taken: the controller could not store it and changed nothing (503)" in caplog.text
    assert "busy" not in caplog.text
    assert outbox.poll(0.05) == [] and len(client.calls) == 1, "re-sent on its timer, not at once"
    outbox.poll(0.12)
    assert len(client.calls) == 2 and client.resyncs == [], "503: wait and re-send, no re-register"


@pytest.mark.parametrize("code,reinit", [(Code.NOT_REGISTERED, False), (Code.JOB_NOT_EXIST, True),
                                         (Code.NOT_INITIALISED, True)])
def test_an_unknown_agent_re_registers_before_the_re_send(box: tuple[Outbox, Client], code: int,
                                                          reinit: bool) -> None:
    outbox, client = box
    outbox.add(fault_report(0.0))
    outbox.poll(0.0)
    client.last.answer = code
    outbox.poll(0.01)
    outbox.poll(0.2)
    assert client.resyncs == [reinit] and len(client.calls) == 2


def test_a_fault_joins_the_pending_report_and_is_sent_again_if_the_attempt_in_flight_lacked_it(
        box: tuple[Outbox, Client]) -> None:
    outbox, client = box
    outbox.add(fault_report(0.0, {1: "1"}))
    outbox.poll(0.0)
    assert outbox.join_fault({2: "1"}, "rank 2")
    client.last.answer = Code.OK
    assert outbox.poll(0.1) == [], "taken without rank 2: not settled"
    assert client.last.request == {1: "1", 2: "1"}, "re-sent at once with both faults"
    client.last.answer = Code.OK
    [settled] = outbox.poll(0.2)
    assert settled.taken and settled.report.detail == "rank 1; rank 2"


def test_reports_go_out_one_at_a_time_in_order(box: tuple[Outbox, Client]) -> None:
    outbox, client = box
    outbox.add(report(STOP_COMPLETE, 0.0))
    outbox.add(report(STRATEGIES, 0.0))
    outbox.poll(0.0)
    assert [c.method for c in client.calls] == ["ReportStopComplete"], "strategies wait for the stop-complete"
    client.last.answer = Code.OK
    [settled] = outbox.poll(0.1)
    assert settled.report.what == "stop complete"
    assert [c.method for c in client.calls] == ["ReportStopComplete", "ReportRecoverStrategy"]


def test_without_a_client_nothing_is_sent_and_the_deadline_still_ends_it() -> None:
    outbox = Outbox(lambda: None, lambda: None)
    outbox.add(fault_report(0.0))
    assert outbox.poll(0.0) == []
    [settled] = outbox.poll(TIMEOUT)
    assert not settled.taken


def test_degraded_mode_starts_at_30s_with_the_default_controller_timeout(box: tuple[Outbox, Client]) -> None:
    """The outbox and the round machine together, on one passed-in clock: a fault at t=100 whose report the
    controller never answers puts a single-node agent in degraded mode at t=130, not before, not later."""
    from taskd.agent.round import events as ev
    from taskd.agent.round.rules import RoundMachine
    from taskd.agent.round.states import LocalPolicy, NodeFacts, NodeState

    outbox, client = box
    m = RoundMachine(NodeFacts(node_count=1, controller_timeout=TIMEOUT), view=SimpleNamespace(),
                     budget=LocalPolicy(3, TIMEOUT, 30.0))
    [report] = [a for a in m.handle(ev.RankFault(1, 1, "1", "rank 1 exited"), 100.0) if isinstance(a, ev.SendReport)]
    outbox.add(fault_report(100.0, report.faults))
    degraded_at = None
    now = 100.0
    while degraded_at is None and now < 200.0:
        for settled in outbox.poll(now):
            m.handle(ev.ReportSettled(settled.taken), now)
            if m.state is NodeState.RESTARTING:
                degraded_at = now
        if client.calls and not client.last.done():
            client.last.error = ServerUnreachable("127.0.0.1:1", "UNAVAILABLE")  # refused at once, every time
        now = round(now + 0.01, 2)
    assert degraded_at == pytest.approx(100.0 + TIMEOUT) and m.degraded


def test_a_report_that_cannot_be_built_settles_at_once(box: tuple[Outbox, Client]) -> None:
    outbox, client = box

    def bad(_client: object, _report: object) -> None:
        raise ValueError("unknown strategy 'teleport'")

    outbox.add(Report(STRATEGIES, bad, ReportRetry(0.0 + TIMEOUT)))
    assert outbox.poll(0.0) == [] and client.calls == []
    [settled] = outbox.poll(0.0)
    assert not settled.taken and len(outbox) == 0


def test_a_call_completing_after_the_link_closed_wakes_nothing() -> None:
    """The loop's wake-up pipe is closed after the link: a late completion must not write to a reused fd."""
    from taskd.agent.config import AgentConfig
    from taskd.agent.link.controller import ControllerLink

    woken: list[int] = []
    link = ControllerLink(AgentConfig(launcher="taskd"), lambda: woken.append(1))
    link.reports.outbox._wake()
    link.close(0, "")
    link.reports.outbox._wake()
    assert woken == [1]


def lossy_report(now: float) -> Report:
    return Report(RESUMED, lambda _c, _r: "resumed", ReportRetry(now + TIMEOUT))


def test_an_informational_report_never_holds_back_the_fault_report_behind_it(box: tuple[Outbox, Client]) -> None:
    """Refused, or not known to an older controller: settled by that first answer; the fault report goes next."""
    outbox, client = box
    for answer, error in ((Code.OUT_OF_ORDER, None), (None, ServerUnreachable("c", "ReportResumed: UNIMPLEMENTED"))):
        outbox.add(lossy_report(0.0))
        outbox.add(fault_report(0.0))
        outbox.poll(0.0)
        client.last.answer, client.last.error = answer, error
        [settled] = outbox.poll(0.1)
        assert not settled.taken and settled.report.kind.lossy
        assert settled.why == ("answered 401: info of 401" if error is None else str(error))
        assert client.last.method == "ReportProcessFault", "the fault report is sent at once"
        client.last.answer = Code.OK
        [settled] = outbox.poll(0.2)
        assert settled.taken and settled.report.kind is FAULT


def test_an_informational_report_is_sent_again_when_the_controller_is_busy_or_unreachable(
        box: tuple[Outbox, Client]) -> None:
    outbox, client = box
    outbox.add(lossy_report(0.0))
    outbox.poll(0.0)
    client.last.answer = Code.STORAGE_ERROR  # nothing changed on the controller: send it again later
    assert outbox.poll(0.1) == [] and len(outbox) == 1
    outbox.poll(5.0)
    client.last.error = ServerUnreachable("c", "ReportResumed: UNAVAILABLE")
    assert outbox.poll(5.1) == [] and len(outbox) == 1
    outbox.poll(10.0)
    client.last.answer = Code.OK
    [settled] = outbox.poll(10.1)
    assert settled.taken and len(client.calls) == 3


def test_dropped_reports_leave_the_queue_and_a_call_in_flight_is_cancelled(box: tuple[Outbox, Client]) -> None:
    """A new stopTrain makes the strategies offered for the round's earlier collection moot (link/controller.py):
    refused 401 until the controller has the new stop complete, they held it back until the deadline."""
    outbox, client = box
    outbox.add(report(STRATEGIES, 0.0))
    outbox.poll(0.0)
    client.last.answer = Code.OUT_OF_ORDER
    outbox.poll(0.1)  # refused: still the head, re-sent on its timer
    outbox.poll(1.0)
    in_flight = client.last
    assert in_flight.method == "ReportRecoverStrategy" and not in_flight.done()
    outbox.add(report(STOP_COMPLETE, 1.1))
    assert outbox.drop(STRATEGIES) == 1 and outbox.drop(STRATEGIES) == 0
    assert in_flight.cancelled and len(outbox) == 1
    outbox.poll(1.2)
    assert client.last.method == "ReportStopComplete", "the stop complete goes out at once"


def test_a_signal_sent_again_with_its_uuid_is_not_carried_out_twice() -> None:
    """Issue 31, F2: a restarted controller resuming a RECOVERING round sends its changeStrategy again (same uuid)
    to every agent that still owes its status; an agent already carrying it out (a restart, a live rebuild) must
    not do it again. A new signal (another uuid: the round's next strategy, the next round) is carried out."""
    from taskd.agent.config import AgentConfig
    from taskd.agent.link.controller import Command, ControllerLink

    link = ControllerLink(AgentConfig(launcher="taskd"), lambda: None)
    change = SimpleNamespace(uuid="j-1-7", signal_type="changeStrategy", actions=["changeStrategy"],
                             fault_ranks={1: "1"}, strategy="recover", timeout=300,
                             extra_params='{"generation": 7, "restarts": 1, "round": 1}')
    handler = link._queue(Command.CHANGE)
    handler(change)
    handler(change)  # re-sent as the agent resubscribed
    first = link.next_order()
    assert first is not None and (first.uuid, first.generation) == ("j-1-7", 7)
    assert link.next_order() is None
    handler(SimpleNamespace(**{**vars(change), "uuid": "j-1-9", "strategy": "job-rescheduling"}))
    nxt = link.next_order()
    assert nxt is not None and nxt.strategy == "job-rescheduling"
    link.close(0, "")
