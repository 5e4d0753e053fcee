"""Straggler judging (taskd/pace.py) and the node's side of it (agent/watches/stragglers.py): pure, no processes."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from taskd.agent.ranks.table import RankState
from taskd.agent.watches.stragglers import BLIND_AFTER, BLIND_START, StragglerWatch
from taskd.pace import CHANGE, CLEAR, MIN_INTERVALS, PaceWindow, RankPace, StragglerJudge, check_factor, peer_medians
from taskd.proto import recover_pb2, taskd_pb2


def paces(*seconds: float, steps: int = 10) -> list[RankPace]:
    return [RankPace(rank, f"host{rank}", s, steps) for rank, s in enumerate(seconds)]


def test_peer_median_is_the_median_of_the_other_ranks() -> None:
    assert peer_medians([1.0, 5.0]) == [5.0, 1.0]
    assert peer_medians([1.0, 1.0, 9.0]) == [5.0, 5.0, 1.0]
    assert peer_medians([3.0, 1.0, 2.0, 10.0]) == [2.0, 3.0, 3.0, 2.0]
    assert all(math.isnan(x) for x in peer_medians([4.0]))
    values = [0.7, 0.1, 0.4, 0.4, 0.9, 0.2]
    for i, got in enumerate(peer_medians(values)):
        others = sorted(values[:i] + values[i + 1:])
        assert got == others[len(others) // 2]  # five others: the middle one


def test_a_rank_slower_than_its_peers_by_the_factor_is_reported_once() -> None:
    judge = StragglerJudge(2.0)
    [v] = judge.judge(paces(0.1, 0.1, 0.35))
    assert (v.rank, v.host, v.cleared) == (2, "host2", False)
    assert v.ratio == pytest.approx(3.5) and v.median == pytest.approx(0.1) and v.seconds == pytest.approx(0.35)
    assert "rank 2 on host2" in v.describe(2.0) and "3.50x" in v.describe(2.0)
    assert judge.judge(paces(0.1, 0.1, 0.36)) == []  # the same standing: nothing new
    assert judge.judge(paces(0.1, 0.1, 0.1 + 0.25 * (1 + CHANGE) + 0.01))[0].rank == 2  # its cost moved: again


def test_a_straggler_whose_ratio_swings_on_its_peers_noise_is_not_reported_again() -> None:
    judge = StragglerJudge(2.0)
    assert judge.judge(paces(0.002, 0.002, 0.052))[0].ratio == pytest.approx(26.0)
    assert judge.judge(paces(0.0031, 0.0031, 0.0521)) == []  # 16.8x: the ratio moved by a third, the cost did not
    assert judge.judge(paces(0.0024, 0.0024, 0.0524)) == []  # 21.8x
    [v] = judge.judge(paces(0.002, 0.002, 0.082))  # 30 ms more a step than when reported: its cost moved
    assert v.ratio == pytest.approx(41.0) and not v.cleared


def test_hysteresis_clears_only_well_under_the_factor() -> None:
    judge = StragglerJudge(2.0)
    judge.judge(paces(0.1, 0.1, 0.3))
    assert judge.judge(paces(0.1, 0.1, 0.1 * 2.0 * CLEAR + 0.01)) == []  # under the factor, over CLEAR x factor
    [v] = judge.judge(paces(0.1, 0.1, 0.1 * 2.0 * CLEAR - 0.01))
    assert v.cleared and v.rank == 2 and "no longer a straggler" in v.describe(2.0)
    assert judge.judge(paces(0.1, 0.1, 0.1)) == []


def test_ranks_too_new_or_without_peers_are_not_judged() -> None:
    judge = StragglerJudge(1.5)
    assert judge.judge([RankPace(0, "h", 1.0, 10)]) == []  # no peers
    assert judge.judge(paces(0.1, 0.1, 0.9, steps=MIN_INTERVALS - 1)) == []
    assert judge.judge(paces(0.0, 0.0, 0.9)) == []  # peers that never compute outside collectives: no ratio
    judge.judge(paces(0.1, 0.1, 0.9))
    assert judge.judge(paces(0.1, 0.1)) == [] and judge.reported == {}  # gone (restarted, finished): forgotten


@pytest.mark.parametrize("bad", [1.0, 0.5, -2.0, float("nan"), float("inf")])
def test_the_factor_must_be_a_finite_number_above_one(bad: float) -> None:
    assert check_factor(bad)
    with pytest.raises(ValueError, match="straggler factor must be a number above 1"):
        StragglerJudge(bad)
    assert check_factor(None) == "" and check_factor(1.2) == ""


def test_window_averages_the_newest_intervals_and_restarts_with_a_new_process() -> None:
    w = PaceWindow(size=4)
    w.observe(pid=10, compute=0.0, intervals=1)
    w.observe(10, 0.2, 2)
    assert w.seconds() is None  # one interval spanned
    for n in range(3, 12):
        w.observe(10, 0.2 * (n - 1), n)
    assert w.seconds() == pytest.approx(0.2) and 4 <= w.intervals <= 5
    w.observe(10, 0.2 * 10 + 4 * 1.0, 15)  # four slow intervals of 1 s: the window holds only those
    assert w.seconds() == pytest.approx(1.0)
    w.observe(11, 0.5, 3)  # a restarted rank: its sums start over, and so does its window
    assert w.seconds() is None and w.pid == 11


class FakeReport:
    """A pace report the outbox settled at once, taken (agent/link/reports.py's `Report.outcome`)."""

    def __init__(self, reply: object) -> None:
        self.outcome = SimpleNamespace(taken=True, why="", reply=reply)


def ranks_and_beats(compute: dict[int, float], intervals: int):  # noqa: ANN201
    ranks = [SimpleNamespace(global_rank=r, local_rank=r, pid=100 + r, state=RankState.RUNNING) for r in compute]
    beats = {r: SimpleNamespace(compute=c * intervals, compute_intervals=intervals,
                                beats=intervals + 1 if intervals else 0) for r, c in compute.items()}
    return ranks, lambda rank: beats[rank.global_rank]


def test_the_watch_reports_every_interval_and_says_what_the_controller_answered() -> None:
    watch = StragglerWatch(1.5, interval=5.0, host="nodeA")
    sent: list[tuple[float, list[tuple[int, float, int]]]] = []
    verdict = taskd_pb2.StragglerRecord(rank=1, nodeRank=0, host="nodeA", ratio=4.0, computeSeconds=0.4,
                                        medianSeconds=0.1)
    replies = [taskd_pb2.PaceReply(status=recover_pb2.Status(code=0)),
               taskd_pb2.PaceReply(status=recover_pb2.Status(code=0), verdicts=[verdict])]

    def link(factor: float, p: list[tuple[int, float, int]], timeout: float) -> FakeReport:
        sent.append((factor, p))
        return FakeReport(replies.pop(0))

    for n, now in ((1, 0.0), (2, 1.0), (6, 2.0)):
        ranks, beat = ranks_and_beats({0: 0.1, 1: 0.4}, n)
        assert watch.sweep(ranks, beat, link, now) == []
    assert len(sent) == 1 and sent[0] == (1.5, [])  # at time 0 no window spanned 3 intervals yet
    ranks, beat = ranks_and_beats({0: 0.1, 1: 0.4}, 9)
    assert watch.sweep(ranks, beat, link, 5.0) == []  # the interval passed: the next report
    assert len(sent) == 2 and [r for r, _, _ in sent[1][1]] == [0, 1]
    assert sent[1][1][1][1] == pytest.approx(0.4)
    [v] = watch.sweep(ranks, beat, link, 6.0)  # its answer, said once
    assert (v.rank, v.host, v.ratio, v.cleared) == (1, "nodeA", 4.0, False)
    assert watch.sweep(ranks, beat, link, 7.0) == [] and len(sent) == 2


def test_a_controller_without_report_pace_leaves_the_node_to_judge_its_own_ranks() -> None:
    watch = StragglerWatch(2.0, interval=1.0, host="nodeA")
    unknown = SimpleNamespace(outcome=SimpleNamespace(taken=False, why="ReportPace: UNIMPLEMENTED", reply=None))
    out = []
    for n, now in ((1, 0.0), (5, 1.0), (9, 2.0)):
        ranks, beat = ranks_and_beats({0: 0.1, 1: 0.1, 2: 0.5}, n)
        out += watch.sweep(ranks, beat, lambda *a: unknown, now)
    assert not watch.remote and [(v.rank, round(v.ratio, 2)) for v in out] == [(2, 5.0)]


def test_without_a_controller_the_node_judges_its_own_ranks() -> None:
    watch = StragglerWatch(2.0, interval=1.0, host="nodeA")
    out = []
    for n, now in ((1, 0.0), (5, 1.0), (9, 2.0)):
        ranks, beat = ranks_and_beats({0: 0.1, 1: 0.1, 2: 0.5}, n)
        out += watch.sweep(ranks, beat, lambda *a: None, now)
    assert [(v.rank, round(v.ratio, 2)) for v in out] == [(2, 5.0)]


@pytest.mark.parametrize("value", [1.0, 0.5, float("inf"), float("nan")])
def test_the_agent_config_refuses_a_factor_that_names_no_straggler(value: float) -> None:
    from taskd.agent.config import AgentConfig

    with pytest.raises(ValueError, match="straggler_factor"):
        AgentConfig(straggler_factor=value)
    assert AgentConfig(straggler_factor=1.5).straggler_factor == 1.5 and AgentConfig().straggler_factor is None


BLIND = "no rank reported a step"


def test_ranks_still_starting_under_load_are_not_called_blind(caplog: pytest.LogCaptureFixture) -> None:
    """Under load the ranks' imports and rendezvous took 75 s here: the watch, every 0.5 s, used to say after 3 s
    that the script sends no heartbeats. Not before the ranks' first step, nor after it: its compute time comes with
    the second."""
    watch = StragglerWatch(3.0, interval=0.5, host="nodeA")
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        for now in range(0, 100):
            watch.sweep(*ranks_and_beats({0: 0.1, 1: 0.1}, 0), None, float(now))  # running, no step yet
        ranks, beat = ranks_and_beats({0: 0.1, 1: 0.1}, 0)
        first = {r.global_rank: SimpleNamespace(compute=0.0, compute_intervals=0, beats=1) for r in ranks}
        for now in range(100, 400):  # the first step's heartbeat, and a long first step under load
            watch.sweep(ranks, lambda rank: first[rank.global_rank], None, float(now))
    assert BLIND not in caplog.text


def test_ranks_that_never_report_a_step_are_called_blind_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = StragglerWatch(3.0, interval=5.0, host="nodeA")
    quiet = max(BLIND_AFTER * 5.0, BLIND_START)
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        for now in (0.0, quiet - 1, quiet, quiet + 100):
            watch.sweep(*ranks_and_beats({0: 0.1, 1: 0.1}, 0), None, 10.0 + now)
            assert (BLIND in caplog.text) == (now >= quiet), now
    assert caplog.text.count(BLIND) == 1 and "heartbeat(step)" in caplog.text


def test_a_job_shorter_than_the_start_grace_is_told_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    """Ranks that ran BLIND_AFTER intervals without a step, and ended before BLIND_START: said once, at the end."""
    watch = StragglerWatch(3.0, interval=0.5, host="nodeA")
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        for now in (0.0, 1.0, 2.0, 3.0, 4.0):
            watch.sweep(*ranks_and_beats({0: 0.1, 1: 0.1}, 0), None, 10.0 + now)
        assert BLIND not in caplog.text
        watch.close()
    assert caplog.text.count(BLIND) == 1 and "in the 4s the ranks ran" in caplog.text
    assert "so no straggler could be named" in caplog.text


def test_a_job_that_ended_before_blind_after_intervals_is_not_told(caplog: pytest.LogCaptureFixture) -> None:
    watch = StragglerWatch(3.0, interval=0.5, host="nodeA")
    with caplog.at_level(logging.WARNING, logger="taskd.agent"):
        for now in (0.0, 1.0, 2.0):
            watch.sweep(*ranks_and_beats({0: 0.1, 1: 0.1}, 0), None, 10.0 + now)
        watch.close()
    assert BLIND not in caplog.text
