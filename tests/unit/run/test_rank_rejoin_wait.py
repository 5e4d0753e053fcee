"""A multi-node job's paused live ranks wait for a lost node's replacement as long as the agent does (issue 17):
TASKD_REJOIN_TIMEOUT's 120 s default was shorter than --node-rejoin-timeout's 300 s, so a replacement that came
after 2 min found the survivors' ranks gone and their live state lost."""

from __future__ import annotations

from taskd.launcher import WorkerSpec
from taskd.run import with_rank_rejoin_wait, with_rank_strategies


def spec(nnodes: int, **extra: str) -> WorkerSpec:
    return WorkerSpec(entrypoint=["train.py"], nnodes=nnodes, node_rank=0, extra_env=extra)


def test_a_multi_node_jobs_ranks_wait_for_the_rejoin_timeout_and_the_replacements_start() -> None:
    got = with_rank_rejoin_wait(spec(2), node_rejoin_timeout=300.0, controller_timeout=60.0, environ={})
    assert got.extra_env["TASKD_REJOIN_TIMEOUT"] == "360"


def test_the_users_own_wait_and_one_node_jobs_are_left_alone() -> None:
    assert "TASKD_REJOIN_TIMEOUT" not in with_rank_rejoin_wait(spec(1), 300.0, 60.0, environ={}).extra_env
    assert "TASKD_REJOIN_TIMEOUT" not in with_rank_rejoin_wait(spec(2), 300.0, 60.0,
                                                               environ={"TASKD_REJOIN_TIMEOUT": "30"}).extra_env
    mine = with_rank_rejoin_wait(spec(2, TASKD_REJOIN_TIMEOUT="45"), 300.0, 60.0, environ={})
    assert mine.extra_env["TASKD_REJOIN_TIMEOUT"] == "45"
    short = with_rank_rejoin_wait(spec(2), node_rejoin_timeout=10.0, controller_timeout=5.0, environ={})
    assert short.extra_env["TASKD_REJOIN_TIMEOUT"] == "120"  # never below the ranks' own default


def test_ranks_see_the_strategies_their_agent_offers() -> None:
    """`taskd.worker.save_on_error()` waits for a dump's save request only when the job offers dump."""
    got = with_rank_strategies(spec(1), ["dump", "exit"])
    assert got.extra_env["TASKD_STRATEGIES"] == "dump,exit"
    assert with_rank_strategies(spec(1, TASKD_STRATEGIES="exit"), ["dump"]).extra_env["TASKD_STRATEGIES"] == "exit"
