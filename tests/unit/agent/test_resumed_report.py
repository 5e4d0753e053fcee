"""Telling taskd's controller the node's ranks train again (agent/resumed_report.py): queued behind the node's
other reports, and each attempt says how long ago training resumed, so that a re-sent report is not late. The
client is a stand-in that records the requests (the real RPC path runs in tests/e2e/agent/test_node_loss_live.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from taskd.agent.reports import Outbox
from taskd.agent.resumed_report import report_resumed
from taskd.vocabulary import Code


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.answer: int | None = None

    def _identity(self) -> dict[str, Any]:
        return {"jobId": "j", "nodeRank": 1, "host": "h", "pid": 7}

    def start_report(self, method: str, request: Any, *, timeout: float, on_done: Any = None) -> Any:
        self.sent.append((method, request))
        return SimpleNamespace(done=lambda: self.answer is not None, cancel=lambda: None,
                               result=lambda: SimpleNamespace(code=self.answer, info=""))


def link(client: Client, clock: list[float], fenced: str | None = None, active: bool = True) -> Any:
    outbox = Outbox(lambda: client, lambda: None, clock=lambda: clock[0])
    return SimpleNamespace(active=active, fencing=SimpleNamespace(fenced=fenced), outbox=outbox,
                           config=SimpleNamespace(controller_timeout=30.0), poll_reports=outbox.poll)


def test_each_attempt_says_how_long_ago_training_resumed() -> None:
    client, clock = Client(), [10.0]
    lk = link(client, clock)
    assert report_resumed(lk, 4, 2.5, at=9.0, clock=lambda: clock[0])
    ((method, req),) = client.sent
    assert method == "ReportResumed"
    assert (req.jobId, req.nodeRank, req.host, req.pid) == ("j", 1, "h", 7)
    assert (req.round, req.seconds, req.secondsAgo, req.unseen) == (4, 2.5, 1.0, False)
    client.answer = Code.STORAGE_ERROR  # busy: sent again, later, saying so
    clock[0] = 13.0
    lk.outbox.poll(13.0)
    client.answer = None
    clock[0] = 13.5
    lk.outbox.poll(13.5)
    assert client.sent[-1][1].secondsAgo == 4.5 and len(client.sent) == 2


def test_a_node_that_cannot_tell_says_so_and_an_agent_without_a_controller_says_nothing() -> None:
    client, clock = Client(), [10.0]
    assert report_resumed(link(client, clock), 2, 99.0, at=0.0, unseen=True, clock=lambda: clock[0])
    req = client.sent[-1][1]
    assert (req.round, req.seconds, req.secondsAgo, req.unseen) == (2, 0.0, 0.0, True)
    assert not report_resumed(link(client, clock, fenced="node 1 is held by h2:9"), 2, 1.0, 0.0)
    assert not report_resumed(link(client, clock, active=False), 2, 1.0, 0.0)
    assert len(client.sent) == 1
