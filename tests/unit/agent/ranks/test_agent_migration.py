"""The agent's pure decisions of a planned migration (agent/ranks/migration.py): whether to start, and the pause."""

from __future__ import annotations

from taskd.agent.ranks.migration import migration_generation, pause_seconds, refusal
from taskd.agent.ranks.table import Rank, RankState


def rank(state: RankState = RankState.RUNNING) -> Rank:
    r = Rank(local_rank=1, global_rank=1)
    r.state = state
    return r


def test_refusal_names_what_is_missing() -> None:
    assert refusal(1, rank(), True, True, "") == ""
    assert refusal(5, None, True, True, "") == "rank 5 does not run on this node"
    assert "no live recovery" in refusal(1, rank(), False, True, "")
    assert refusal(1, rank(), True, True, "a recovery is in progress on this node") == \
        "a recovery is in progress on this node"
    assert "not running" in refusal(1, rank(RankState.FAILED), True, True, "")
    assert "declared it can rejoin" in refusal(1, rank(), True, False, "")


def test_pause_runs_from_the_first_rank_leaving_to_the_last_rank_synced() -> None:
    left = {0: 10.0, 1: 10.02, 2: 10.01}
    joined = {0: 10.31, 1: 10.30, 2: 10.35}
    assert abs(pause_seconds(left, joined) - 0.35) < 1e-9
    assert pause_seconds({}, joined) == 0.0 and pause_seconds(left, {}) == 0.0


def test_a_migration_after_one_called_off_names_the_next_generation_of_the_node() -> None:
    """_call_off named generation 3 on the node, unknown to the controller, which then asks for 3 again."""
    assert migration_generation(3, 2) == 3
    assert migration_generation(3, 3) == 4 and migration_generation(2, 5) == 6
