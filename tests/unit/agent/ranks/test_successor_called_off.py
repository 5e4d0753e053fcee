"""A node migration's successor (agent/ranks/node_migration.py) told "off" by the controller: it stops the ranks it
started, gives the node back (no node rank, no rank table) and says so once through `poll` (`GaveUp`, which the
round machine turns into "waits again"), without reporting a failure the controller already knows of. A staying
node's "off" of another migration changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

from taskd.agent.ranks.node_migration import GaveUp, NodeMove, NodeMoves
from taskd.agent.ranks.table import RankLayout, RankTable


class Parts:
    """What NodeMoves touches, recorded: the launcher's node rank, stopped ranks, reports."""

    def __init__(self) -> None:
        self.node_ranks: list[int | None] = []
        self.stopped: list[list[int]] = []
        self.reports: list[dict[str, object]] = []
        self.details = SimpleNamespace(set_node_rank=self.node_ranks.append)
        self.live = SimpleNamespace(details=self.details)
        self.control = SimpleNamespace(stop=lambda ranks, graceful: self.stopped.append([r.global_rank
                                                                                           for r in ranks]))
        self.link = SimpleNamespace(reports=SimpleNamespace(migration=lambda **kw: self.reports.append(kw)))


def successor() -> tuple[NodeMoves, RankTable, Parts]:
    parts = Parts()
    table = RankTable()
    table.lay_out(RankLayout(1, 2, (1,)))
    moves = NodeMoves(table, parts.live, parts.control, parts.link, lambda node: None)  # type: ignore[arg-type]
    moves.active = NodeMove("mig-1", 1, 7, "successor", deadline=100.0)
    return moves, table, parts


def test_off_stops_the_successors_ranks_and_gives_the_node_back_once() -> None:
    moves, table, parts = successor()
    moves.order("mig-1", "off", 1, 9, "", "", 1.0)
    assert len(parts.stopped) == 1  # its ranks stopped (SIGKILL), once
    assert parts.node_ranks == [None] and table.layout is None and len(table) == 0 and moves.active is None
    done = moves.poll(2.0)
    assert isinstance(done, GaveUp) and "the controller called the migration off" in done.reason, done
    assert moves.poll(3.0) is None and parts.reports == []  # said once; nothing reported back


def test_an_off_of_another_migration_changes_nothing() -> None:
    moves, table, parts = successor()
    moves.order("mig-0", "off", 1, 9, "", "", 1.0)
    assert moves.active is not None and table.layout is not None and parts.stopped == [] and parts.node_ranks == []
