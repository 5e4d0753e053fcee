"""ReportRetryPolicy and the backoff: pure functions of their inputs, driven without a network or a clock."""

from __future__ import annotations

import pytest

from taskd.client.retry import (
    BUSY_CODES,
    AnswerKind,
    Backoff,
    ReportRetryPolicy,
    backoff_delay,
    classify,
)
from taskd.vocabulary import Code

POLICY = ReportRetryPolicy(budget=30.0, initial=0.5, maximum=10.0)


def test_accepted_and_invalid_are_never_resent() -> None:
    assert POLICY.decide(Code.OK, attempt=1, elapsed=0).retry is False
    invalid = POLICY.decide(Code.INVALID_PARAMS, attempt=1, elapsed=0)
    assert invalid.retry is False and "invalid" in invalid.why


@pytest.mark.parametrize("busy", sorted(BUSY_CODES))
def test_busy_waits_without_reregistering_for_as_long_as_it_lasts(busy: int) -> None:
    for attempt in range(1, 6):
        decision = POLICY.decide(busy, attempt=attempt, elapsed=0.0, previous=[busy] * (attempt - 1))
        assert decision.retry and not decision.reregister and not decision.reinit


def test_unknown_agent_reregisters_and_unknown_job_reinits_first() -> None:
    not_registered = POLICY.decide(Code.NOT_REGISTERED, attempt=3, elapsed=0, previous=[400, 400])
    assert not_registered.retry and not_registered.reregister and not not_registered.reinit
    for code in (Code.JOB_NOT_EXIST, Code.NOT_INITIALISED):
        decision = POLICY.decide(code, attempt=1, elapsed=0)
        assert decision.retry and decision.reregister and decision.reinit


def test_any_other_code_gets_exactly_one_reregister_and_resend() -> None:
    first = POLICY.decide(Code.OUT_OF_ORDER, attempt=1, elapsed=0)
    assert first.retry and first.reregister
    second = POLICY.decide(Code.OUT_OF_ORDER, attempt=2, elapsed=1, previous=[Code.OUT_OF_ORDER])
    assert not second.retry and "after re-register" in second.why
    # a busy answer in between does not earn the "other" answer a second chance
    third = POLICY.decide(Code.DUMP_FAILED, attempt=3, elapsed=1, previous=[Code.OUT_OF_ORDER, Code.RATE_LIMITED])
    assert not third.retry


def test_the_delay_grows_is_capped_and_jitter_only_shortens_it() -> None:
    delays = [POLICY.decide(Code.RATE_LIMITED, attempt=n, elapsed=0).delay for n in range(1, 8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]  # draw 0: no jitter
    jittered = POLICY.decide(Code.RATE_LIMITED, attempt=2, elapsed=0, draw=0.999).delay
    assert 1.0 * (1 - 0.3) <= jittered < 1.0


def test_a_pause_that_would_pass_the_budget_ends_the_report() -> None:
    policy = ReportRetryPolicy(budget=1.5, initial=0.5, maximum=10.0)
    assert policy.decide(Code.RATE_LIMITED, attempt=1, elapsed=0.5).retry  # 0.5 + 0.5 + 0.05 < 1.5
    late = policy.decide(Code.RATE_LIMITED, attempt=1, elapsed=0.96)  # 0.96 + 0.5 + 0.05 >= 1.5
    assert not late.retry and "1.5s deadline" in late.why


def test_classify_names_every_kind() -> None:
    assert [classify(c) for c in (0, 409, 429, 400, 401)] == [
        AnswerKind.OK, AnswerKind.INVALID, AnswerKind.BUSY, AnswerKind.UNKNOWN_AGENT, AnswerKind.OTHER]


@pytest.mark.parametrize("kwargs", [{"budget": 0}, {"budget": 1, "initial": 0}, {"budget": 1, "initial": 2,
                                                                                  "maximum": 1}])
def test_bad_policy_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ReportRetryPolicy(**kwargs)


def test_backoff_is_the_stateful_walk_of_backoff_delay() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(6)] == [backoff_delay(n, 0.1, 1.0, 2.0, 0.0, 0.0) for n in range(6)]
    backoff.reset()
    assert backoff.next_delay() == 0.1
