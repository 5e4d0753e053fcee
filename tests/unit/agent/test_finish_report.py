"""ReportFinished's delivery: re-sent until acknowledged, within one budget; never re-sent when it cannot help."""

from __future__ import annotations

from taskd.agent.finish_report import ATTEMPT_TIMEOUT, FinishReport
from taskd.vocabulary import Code


def test_an_unreachable_controller_is_asked_again_until_it_acknowledges() -> None:
    report = FinishReport(0, "", started=100.0, budget=30.0)
    now, pauses = 100.0, []
    for _ in range(5):  # the controller is restarting: no answer, then "could not store it"
        step = report.answer(None if len(pauses) < 3 else Code.STORAGE_ERROR, now)
        assert not step.done
        pauses.append(step.pause)
        now += step.pause
    assert pauses == sorted(pauses) and pauses[0] < 0.5 and max(pauses) <= 2.0  # short: it is back within seconds
    step = report.answer(Code.OK, now)
    assert step.done and report.delivered and report.attempts == 6


def test_the_budget_bounds_the_delivery() -> None:
    report = FinishReport(1, "rank failed", started=0.0, budget=3.0)
    now, step = 0.0, None
    while True:
        step = report.answer(None, now, "recovery controller at x is unreachable")
        if step.done:
            break
        now += step.pause
    assert now < 3.0 and not report.delivered
    assert "not acknowledged within 3s" in step.why and "unreachable" in step.why
    assert report.attempt_timeout(2.99) == 0.05 and report.attempt_timeout(0.0) == min(ATTEMPT_TIMEOUT, 3.0)


def test_a_refusal_that_would_repeat_ends_it_at_once() -> None:
    for code in (Code.INVALID_PARAMS, Code.FENCED):
        report = FinishReport(0, "", started=0.0, budget=30.0)
        step = report.answer(code, 0.1, f"answer {int(code)}")
        assert step.done and not report.delivered and "cannot help" in step.why


def test_deliver_sends_until_acknowledged_and_stops_at_a_fence() -> None:
    from taskd.agent.finish_report import deliver
    from taskd.client.errors import FencedError, ServerUnreachable

    now, answers, timeouts = [0.0], [ServerUnreachable("x"), Code.STORAGE_ERROR, Code.OK], []

    def send(report: FinishReport, timeout: float) -> int:
        timeouts.append(timeout)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    report = FinishReport(0, "", started=0.0, budget=30.0)
    deliver(report, send, lambda: now[0], lambda s: now.__setitem__(0, now[0] + s))
    assert report.delivered and report.attempts == 3 and timeouts[0] == ATTEMPT_TIMEOUT
    fenced = FinishReport(0, "", started=0.0, budget=30.0)
    deliver(fenced, lambda r, t: (_ for _ in ()).throw(FencedError("ReportFinished", "node 0 is held by h:1")),
            lambda: 0.0, lambda s: None)
    assert not fenced.delivered and fenced.attempts == 1 and "h:1" in fenced.last
