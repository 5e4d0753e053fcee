"""The agent's one place to report (agent/link/reports.py's `Reporter`, agent/link/report_policy.py's table): every kind
past the same checks into the outbox, one retry policy, kinds differing by data. The client is a stand-in that records
the requests (the real RPC path runs in tests/e2e/agent: test_finish_delivery_e2e.py, test_node_loss_live.py)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from taskd.agent.link import report_policy
from taskd.agent.link.registration import Fencing
from taskd.agent.link.report_policy import FAULT, FINISH, KINDS, PACE, RESUMED, ReportKind, check_kinds
from taskd.agent.link.reports import Reporter
from taskd.client.errors import ServerUnreachable
from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Code

ROOT = Path(__file__).resolve().parents[4]


class Client:
    """Answers each attempt with the next of `answers` (an int, an exception, a reply; None: still in flight)."""

    def __init__(self, *answers: Any, standby: bool = False) -> None:
        self.sent: list[tuple[str, Any, float]] = []
        self.answers = list(answers)
        self.info = recover_pb2.ClientInfo(jobId="j", nodeRank=1, standby=standby)
        self.registered_with = None

    def identity(self) -> dict[str, Any]:
        return {"jobId": "j", "nodeRank": 1, "host": "h", "pid": 7}

    def __getattr__(self, name: str) -> Any:  # the *_request builders: the request names its method's arguments
        if name.endswith("_request"):
            return lambda *a, **k: (name, a, k)
        raise AttributeError(name)

    def start_report(self, method: str, request: Any, *, timeout: float, on_done: Any = None) -> Any:
        self.sent.append((method, request, timeout))
        answer = self.answers.pop(0) if self.answers else Code.OK

        def result() -> Any:
            if isinstance(answer, Exception):
                raise answer
            return recover_pb2.Status(code=answer, info=f"info of {answer}") if isinstance(answer, int) else answer
        return SimpleNamespace(done=lambda: answer is not None, cancel=lambda: None, result=result)

    def resync(self, *, reinit: bool, timeout: float) -> int:
        return 0


def reporter(client: Client | None, timeout: float = 30.0) -> tuple[Reporter, list[str]]:
    fenced: list[str] = []
    return Reporter(lambda: client, Fencing(fenced.append), timeout, lambda: None), fenced


def test_each_resumed_attempt_says_how_long_ago_training_resumed() -> None:
    client, clock = Client(Code.STORAGE_ERROR, None), [10.0]
    rep, _ = reporter(client)
    assert rep.resumed(4, 2.5, at=9.0, clock=lambda: clock[0])
    ((method, req, _),) = client.sent
    assert method == "ReportResumed"
    assert (req.jobId, req.nodeRank, req.host, req.pid) == ("j", 1, "h", 7)
    assert (req.round, req.seconds, req.secondsAgo, req.unseen) == (4, 2.5, 1.0, False)
    rep.poll(10.1)  # busy: sent again, later, saying so
    clock[0] = 13.5
    rep.poll(13.5)
    assert client.sent[-1][1].secondsAgo == 4.5 and len(client.sent) == 2


def test_a_node_that_cannot_tell_says_so() -> None:
    client, clock = Client(), [10.0]
    rep, _ = reporter(client)
    assert rep.resumed(2, 99.0, at=0.0, unseen=True, clock=lambda: clock[0])
    req = client.sent[-1][1]
    assert (req.round, req.seconds, req.secondsAgo, req.unseen) == (2, 0.0, 0.0, True)


@pytest.mark.parametrize("case", ["no controller", "fenced", "a standby"])
def test_every_report_passes_the_same_checks(case: str) -> None:
    """No controller, fenced, a standby: no kind of report is sent (pace and finish had checks of their own)."""
    client = None if case == "no controller" else Client(standby=case == "a standby")
    rep, _ = reporter(client)
    if case == "fenced":
        rep._fencing.fence("node 1 is held by h2:9")
    assert rep.refused() == case
    rep.fault({1: "1"}, "rank 1", 0.0)
    rep.stop_complete({1: "1"})
    rep.strategies({1: "1"}, ["retry"])
    rep.status(0, "", {1: "1"}, "retry")
    assert not rep.resumed(1, 1.0, 0.0)
    rep.restarts(2)
    assert rep.pace(2.0, [], 5.0) is None
    rep.finished(0, "")
    assert len(rep.outbox) == 0 and (client is None or client.sent == [])
    assert rep._finish_thread is None


def test_the_finish_goes_after_the_rounds_reports_and_is_sent_until_taken() -> None:
    """The controller is restarting as the node ends: unanswered, then "could not store it", then taken."""
    client = Client(Code.OK, Code.OK, ServerUnreachable("c", "ReportFinished: UNAVAILABLE"), Code.STORAGE_ERROR,
                    Code.OK)
    rep, _ = reporter(client)
    rep.status(0, "", {1: "1"}, "retry")
    rep.pace(2.0, [], 5.0)
    rep.finished(3, "rank 1 exited with code 3")
    rep.wait_finished()
    assert [m for m, _, _ in client.sent] == ["ReportRecoverStatus", "ReportPace", "ReportFinished",
                                              "ReportFinished", "ReportFinished"]
    assert client.sent[-1][1] == ("finish_request", (3, "rank 1 exited with code 3"), {})
    assert rep._finish is not None and rep._finish.outcome is not None and rep._finish.outcome.taken


def test_a_refused_finish_is_not_sent_again_and_an_unanswered_one_ends_at_its_deadline() -> None:
    client = Client(Code.INVALID_PARAMS)
    rep, _ = reporter(client)
    rep.finished(0, "")
    rep.wait_finished()
    assert len(client.sent) == 1 and not rep._finish.outcome.taken and "409" in rep._finish.outcome.why
    client = Client(*[ServerUnreachable("c", "UNAVAILABLE")] * 100)
    rep, _ = reporter(client, timeout=0.5)  # FINISH's budget: at least 1 s
    started = time.monotonic()
    rep.finished(0, "")
    rep.wait_finished()
    assert 1.0 <= time.monotonic() - started < 3.0 and not rep._finish.outcome.taken
    assert 3 <= len(client.sent) <= 8, "0.1 s doubling to 2 s within 1 s"


def test_a_fenced_answer_fences_the_agent_and_ends_the_report() -> None:
    client = Client(Code.FENCED)
    rep, fenced = reporter(client)
    rep.stop_complete({})
    rep.poll(time.monotonic())  # the answer is read on the loop's next turn
    assert fenced and rep.refused() == "fenced" and len(rep.outbox) == 0


def test_a_pace_report_is_sent_once_beside_the_queue_and_carries_its_verdicts() -> None:
    verdict = taskd_pb2.StragglerRecord(rank=1, host="h", ratio=4.0)
    reply = taskd_pb2.PaceReply(status=recover_pb2.Status(code=0), verdicts=[verdict])
    client = Client(None, reply)  # the fault report stays in flight: the pace report does not wait behind it
    rep, _ = reporter(client)
    rep.fault({1: "1"}, "rank 1", time.monotonic())
    pace = rep.pace(2.0, [(1, 0.4, 9)], 1.0)
    assert pace is not None and [m for m, _, _ in client.sent] == ["ReportProcessFault", "ReportPace"]
    rep.poll(time.monotonic())
    assert pace.outcome is not None and pace.outcome.taken and list(pace.outcome.reply.verdicts) == [verdict]
    assert len(rep.outbox) == 1 and rep.fault_pending
    unknown = Client(ServerUnreachable("c", "ReportPace: UNIMPLEMENTED"))
    rep, _ = reporter(unknown)
    pace = rep.pace(2.0, [], 5.0)
    rep.poll(time.monotonic())
    assert pace.outcome is not None and not pace.outcome.taken and "UNIMPLEMENTED" in pace.outcome.why
    busy = Client(Code.STORAGE_ERROR)
    rep, _ = reporter(busy)
    pace = rep.pace(2.0, [], 5.0)
    rep.poll(time.monotonic())
    assert pace.outcome is not None and len(busy.sent) == 1, "never re-sent: the next interval's replaces it"


def test_the_policy_is_one_for_all_kinds_and_the_table_checks_itself() -> None:
    assert [k.what for k in KINDS] == ["fault report", "stop complete", "strategies", "recover status",
                                       "training resumed", "restart count", "finish report", "pace report",
                                       "migration report"]
    assert FINISH.settles(Code.INVALID_PARAMS) and not FAULT.settles(Code.INVALID_PARAMS)
    assert RESUMED.settles(Code.OUT_OF_ORDER) and not RESUMED.settles(Code.STORAGE_ERROR)
    assert RESUMED.settles(None, "UNIMPLEMENTED") and not RESUMED.settles(None, "UNAVAILABLE")
    assert PACE.settles(Code.STORAGE_ERROR) and PACE.settles(None, "UNAVAILABLE")
    assert FINISH.budget(0.5) == 1.0 and FAULT.budget(0.5) == 0.5 and PACE.budget(30.0, 2.0) == 2.0
    with pytest.raises(ValueError, match="given twice"):
        check_kinds((FAULT, dataclasses.replace(RESUMED, what=FAULT.what)))
    with pytest.raises(ValueError, match="fenced"):
        check_kinds((ReportKind("x", "X", "", final=frozenset()),))
    with pytest.raises(ValueError, match="lossy"):
        check_kinds((ReportKind("x", "X", "", resend=False),))


def test_docs_client_table_is_current(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "client.md"
    assert report_policy.DOC.update(doc.read_text()) == doc.read_text(), (
        "docs/client.md's report table is stale: run python -m taskd.agent.link.report_policy --write docs/client.md")
    stale = tmp_path / "client.md"
    stale.write_text(doc.read_text().replace("| finish report", "| the finish"))
    assert report_policy.main(["--check", str(stale)]) == 1
    assert report_policy.main(["--write", str(stale)]) == 0 and stale.read_text() == doc.read_text()


def test_no_thread_is_left_behind() -> None:
    before = {t.name for t in threading.enumerate()}
    rep, _ = reporter(Client())
    rep.finished(0, "")
    rep.wait_finished()
    assert "taskd-finish" not in {t.name for t in threading.enumerate()} - before
