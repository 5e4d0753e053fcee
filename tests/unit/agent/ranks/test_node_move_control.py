"""Every rank that joins a node migration's generation reads, in its own node's control file, that it is a node
move (agent/ranks/node_migration.py): the successor's standby writes the same request as the job's nodes, so that
only such a join counts itself in for the leaving ranks (taskd.worker.migration.count_joined)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from taskd.agent.ranks.node_migration import NodeMoves
from taskd.agent.ranks.table import RankLayout, RankTable
from taskd.worker.control_file import read_control
from taskd.worker.migration import leaving, names_node_move


def moves(tmp_path: Path, table: RankTable, node_rank: int | None) -> tuple[NodeMoves, list[dict[str, object]]]:
    """NodeMoves over a real control file; the launcher's, the rank control's and the link's parts recorded."""
    reports: list[dict[str, object]] = []
    generations: list[int] = []
    details = SimpleNamespace(live_recovery=True, set_node_rank=lambda node: None, set_generation=generations.append)
    live = SimpleNamespace(details=details, control_path=str(tmp_path / "control"), enabled=True, generation=3,
                           next_generation=lambda g: g)
    control_path = tmp_path / "control"

    def start(local: list[int] | None) -> tuple[int, list[object]]:  # as the launcher's: a stale request cleared
        control_path.unlink(missing_ok=True)
        return 0, []
    control = SimpleNamespace(start=start)
    link = SimpleNamespace(reports=SimpleNamespace(migration=lambda **kw: reports.append(kw)),
                           hand_over=lambda on: None)
    if node_rank is not None:
        table.lay_out(RankLayout(node_rank, 2, (2 * node_rank, 2 * node_rank + 1)))

    def lay_out(node: int) -> None:
        table.lay_out(RankLayout(node, 2, (2 * node, 2 * node + 1)))
    return NodeMoves(table, live, control, link, lay_out), reports  # type: ignore[arg-type]


def test_the_successors_control_names_the_node_move_as_the_staying_nodes_does(tmp_path: Path) -> None:
    """Written once its ranks started (the launcher clears the file as it starts them): they read it once g formed,
    which needs the staying ranks, told only after the successor's "ready"."""
    successor, reports = moves(tmp_path / "standby", RankTable(), None)
    staying, _ = moves(tmp_path / "node0", RankTable(), 0)
    (tmp_path / "standby").mkdir()
    (tmp_path / "node0").mkdir()
    successor.order("mig-1", "prepare", 1, 7, "", "", 1.0)
    staying.order("mig-1", "go", 1, 7, "", "", 2.0)
    assert reports == [] and successor.active is not None and successor.active.role == "successor"
    theirs, ours = read_control(tmp_path / "standby" / "control"), read_control(tmp_path / "node0" / "control")
    assert theirs is not None and ours is not None
    for control in (theirs, ours):  # every joiner of 7 counts itself in; of no other generation
        assert names_node_move(control, 7) and not names_node_move(control, 8)
        assert control.action == "migrate" and leaving(control) == {2, 3}
