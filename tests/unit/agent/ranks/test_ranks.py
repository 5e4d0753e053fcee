"""The rank table and layout discovery from MONITOR's first answer, without processes."""

from __future__ import annotations

import pytest

from taskd.agent.config import AgentConfig
from taskd.agent.ranks.table import RankLayout, RankState, RankTable, discover_layout


def config(**kw: object) -> AgentConfig:
    return AgentConfig(launcher="taskd", **kw)  # type: ignore[arg-type]


def test_msrun_answer_gives_node_and_global_ranks() -> None:
    entries = {0: {"status": 200, "global_rank": 4, "node_id": 1}, 1: {"status": 200, "global_rank": 5, "node_id": 1}}
    layout = discover_layout(config(), entries, environ={"MS_WORKER_NUM": "8"})
    assert layout == RankLayout(node_rank=1, node_count=4, global_ranks=(4, 5))
    assert layout.ranks_per_node == 2


def test_configuration_wins_and_is_not_rewritten() -> None:
    cfg = config(node_rank=2, node_count=3, ranks_per_node=2)
    layout = discover_layout(cfg, {0: {}, 1: {}, 2: {}}, environ={})
    assert layout == RankLayout(2, 3, (4, 5))
    assert (cfg.node_rank, cfg.node_count, cfg.ranks_per_node) == (2, 3, 2)
    assert discover_layout(config(), {0: {}}, environ={}) == RankLayout(0, 1, (0,))


def test_node_rank_from_global_rank_and_bad_world_size_ignored() -> None:
    layout = discover_layout(config(), {0: {"global_rank": 6}, 1: {"global_rank": 7}}, environ={"WORLD_SIZE": "x"})
    assert (layout.node_rank, layout.node_count) == (3, 1)


def test_no_ranks_says_what_to_set() -> None:
    with pytest.raises(RuntimeError, match="TASKD_NPROC_PER_NODE"):
        discover_layout(config(), {}, environ={})


def test_table_maps_fault_ranks_and_states() -> None:
    table = RankTable(RankLayout(1, 2, (2, 3)))
    assert table.local_of({3: "1", 9: "1"}) == [1], "ranks of other nodes are ignored"
    assert not table.all_succeeded()
    table[0].state = RankState.RUNNING
    table[1].state = RankState.STOPPING
    assert [r.local_rank for r in table.alive()] == [0, 1]
    for rank in table.all():
        rank.state = RankState.SUCCEEDED
    assert table.all_succeeded()
    assert RankTable().all_succeeded() is False, "an empty table is not a finished job"
