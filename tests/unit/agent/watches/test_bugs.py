"""agent/watches/exits.py: which failures a restart cannot mend (issue 32 F8), judged from facts alone."""

from __future__ import annotations

from taskd.agent.watches.exits import START_WINDOW, BugJudge, RankEnd, error_of

TB = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "x.py", line 3, in <module>',
      "[rank1]: ValueError: bad"]


def end(error: str = "ValueError: bad", step: int | None = None, any_step: bool = False, ran: float = 1.0,
        pid: int = 10, rank: int = 1) -> RankEnd:
    return RankEnd(rank, pid, error, step, any_step, ran)


def test_the_error_is_the_recorded_one_else_a_traceback_that_ends_an_exit_1() -> None:
    assert error_of(1, "KeyError: 'x'", TB) == "KeyError: 'x'"
    assert error_of(1, "", TB) == "ValueError: bad"  # torch's [rankN]: prefix dropped
    assert error_of(3, "", TB) == ""  # sys.exit(3): the script's own code, not an exception
    assert error_of(-9, "", TB) == ""  # a signal is a fault
    assert error_of(1, "", ["bye"]) == ""  # sys.exit("bye"): no traceback
    assert error_of(1, "", TB[:2]) == ""  # a traceback cut off: no exception line
    aborted = [*TB, "terminate called without an active exception"]  # torch's gloo teardown, after the traceback
    assert error_of(-6, "", aborted) == "ValueError: bad"
    assert error_of(-6, "", ["terminate called without an active exception"]) == ""  # an abort alone: a fault


def test_an_error_at_start_is_a_bug_and_a_signal_beside_it_makes_the_round_a_fault() -> None:
    assert BugJudge().judge([end()]).rule.name == "before-any-step"
    assert BugJudge().judge([end(), end(error="", pid=11, rank=0)]) is None
    assert BugJudge().judge([end(ran=START_WINDOW + 1)]) is None  # no heartbeats: past its start by its run time
    assert BugJudge().judge([end(step=3, any_step=True)]) is None  # after progress: a fault, restarted


def test_the_same_error_at_the_same_step_in_another_incarnation_is_a_bug() -> None:
    judge = BugJudge()
    assert judge.judge([end(step=4, any_step=True, pid=10)]) is None
    assert judge.judge([end(step=4, any_step=True, pid=10)]) is None  # the same round offered again: not "twice"
    assert judge.judge([end(step=5, any_step=True, pid=11)]) is None  # another step
    assert judge.judge([end(step=4, any_step=True, pid=12)]).rule.name == "same-error-twice"
    late = BugJudge()  # no heartbeats, past its start: the step is unknown, so never "the same step"
    assert late.judge([end(ran=99.0, pid=1)]) is None and late.judge([end(ran=99.0, pid=2)]) is None


def test_a_live_usage_error_is_a_bug_whenever_it_comes() -> None:
    bug = BugJudge().judge([end("taskd.worker.torch_state.LiveUsageError: rank 0: 1 collective(s)", step=9,
                                any_step=True, ran=600.0)])
    assert bug is not None and bug.rule.name == "live-usage" and "LiveUsageError" in bug.describe()
