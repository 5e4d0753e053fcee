"""The agent's local policy, driven without processes: degraded restart budget, dump timing, and the
controller-loss and fault-report timers (the clock is passed in)."""

from __future__ import annotations

import pytest

from taskd.agent.link.report_policy import ReportRetry
from taskd.agent.round.states import LocalPolicy, LossTimer


def policy(max_restarts: int = 2, controller_timeout: float = 30.0, dump_timeout: float = 30.0) -> LocalPolicy:
    return LocalPolicy(max_restarts=max_restarts, controller_timeout=controller_timeout, dump_timeout=dump_timeout)


def test_degraded_restart_budget_counts_then_refuses() -> None:
    p = policy(max_restarts=2)
    assert [p.spend_restart(), p.spend_restart(), p.spend_restart()] == [1, 2, None]
    assert p.restarts_used == 2
    assert p.spend_restart() is None, "a spent budget stays spent"


def test_no_budget_means_no_local_restart() -> None:
    assert policy(max_restarts=0).spend_restart() is None


@pytest.mark.parametrize("signal_timeout,expected", [
    (None, 30.0),  # no deadline from the controller: ours
    (0, 30.0),
    (10, 8.0),  # 80% of the controller's, leaving it time to hear the result
    (100, 30.0),  # never longer than ours
    (0.5, 1.0),  # never below 1 s
])
def test_dump_budget(signal_timeout: float | None, expected: float) -> None:
    assert policy(dump_timeout=30.0).dump_budget(signal_timeout) == pytest.approx(expected)


def test_report_retry_backs_off_until_the_deadline() -> None:
    retry = ReportRetry(deadline=100.0 + 2.0)  # a report made at 100 with a 2 s controller timeout
    assert retry.due(100.0), "the first attempt goes at once"
    gaps = []
    now = 100.0
    while not retry.expired(now):
        retry.sent()
        assert retry.answered(None, now, "unreachable").retry
        assert not retry.due(now), "a retry is scheduled, not sent in a loop"
        gaps.append(round(retry.next_at - now, 3))
        now = retry.next_at
    assert gaps == [0.1, 0.2, 0.4, 0.8, 0.5], "the last re-send is at the deadline, not past it"
    assert now == 102.0 and not retry.due(now), "gave up exactly at the controller timeout, not later"


def test_report_retry_delay_is_capped() -> None:
    retry = ReportRetry(deadline=1000.0)
    now = 0.0
    for _ in range(10):
        retry.answered(503, now)
        now = retry.next_at
    assert retry.delay == 2.0


def test_loss_timer_fires_after_the_timeout_while_a_round_waits() -> None:
    timer = LossTimer(timeout=30.0)
    assert timer.expired(0.0, waiting_on_lost_controller=True) is None  # starts counting
    assert timer.expired(29.9, waiting_on_lost_controller=True) is None
    assert timer.expired(31.0, waiting_on_lost_controller=True) == pytest.approx(31.0)
    assert timer.expired(31.5, waiting_on_lost_controller=True) is None, "fires once, then counts again"


def test_loss_timer_resets_when_the_controller_returns_or_the_round_ends() -> None:
    timer = LossTimer(timeout=30.0)
    timer.expired(0.0, True)
    assert timer.expired(20.0, False) is None  # reconnected (or no round): forget the loss
    assert timer.expired(40.0, True) is None  # counting again from 40
    assert timer.expired(69.0, True) is None
    assert timer.expired(70.0, True) == pytest.approx(30.0)
