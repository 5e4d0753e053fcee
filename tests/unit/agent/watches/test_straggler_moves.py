"""`--migrate-stragglers`' decisions (taskd/agent/watches/straggler_moves.py): pure, on a clock of the test's."""

from __future__ import annotations

from taskd.agent.watches.straggler_moves import MOVE, WAIT, Facts, StragglerMoves, decide
from taskd.pace import Verdict

INTERVAL = 1.0  # a window is two: 2 s


def slow(rank: int = 1, cleared: bool = False, seconds: float = 0.1) -> Verdict:
    return Verdict(rank, "h", 5.0, seconds, 0.02, cleared)


class Node:
    """The agent as the mover sees it: its ranks, the migrations started (a spare ready or not), its state."""

    def __init__(self, spare: bool = True) -> None:
        self.spare = spare
        self.started: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        self.active = False
        self.running = True
        self.nodes = 1
        self.moves = StragglerMoves(INTERVAL, lambda: {0, 1}, self.start, lambda: self.running, lambda: self.active,
                                    lambda: self.nodes == 1)

    def start(self, migration: str, rank: int, now: float) -> bool:
        (self.started if self.spare else self.refused).append((migration, rank))
        self.active = self.spare
        return self.spare


def test_a_straggler_moves_once_it_was_one_for_a_whole_window() -> None:
    node = Node()
    assert node.moves.act([slow()], 10.0) == []  # judged now: not sustained
    assert node.moves.act([], 11.9) == []
    [migration] = node.moves.act([], 12.0)
    assert migration.startswith("straggler-") and node.started == [(migration, 1)]
    node.active = False  # the migration ended; its successor is judged afresh: no second move without a verdict
    assert node.moves.act([], 30.0) == [] and len(node.started) == 1


def test_a_slow_step_must_have_left_the_pace_window_too() -> None:
    """One stall of the host stays in the judge's 10-step window: a straggler whose steps take 0.5 s of compute
    is sustained after 10 x 0.5 s, not after the 2 s window."""
    node = Node()
    node.moves.act([slow(seconds=0.5)], 10.0)
    assert node.moves.act([], 14.9) == [] and len(node.moves.act([], 15.0)) == 1


def test_a_rank_cleared_within_the_window_is_not_moved() -> None:
    node = Node()
    node.moves.act([slow()], 10.0)
    node.moves.act([slow(cleared=True)], 11.0)
    assert node.moves.act([], 20.0) == [] and not node.started


def test_no_spare_no_move_and_the_next_try_a_window_later() -> None:
    """`Migrations.start` refuses (and reports why) when no spare is ready: nothing changes, and the rank is tried
    again no sooner than a window later."""
    node = Node(spare=False)
    node.moves.act([slow()], 10.0)
    assert node.moves.act([], 12.0) == [] and len(node.refused) == 1
    node.moves.act([], 13.9)
    assert len(node.refused) == 1  # not within the window
    node.spare = True
    assert len(node.moves.act([], 14.0)) == 1 and len(node.started) == 1


def test_one_move_a_window_on_a_node_and_none_during_a_recovery_or_on_many_nodes() -> None:
    node = Node()
    node.moves.act([slow(0), slow(1)], 10.0)
    assert len(node.moves.act([], 12.0)) == 1
    node.active = False
    assert node.moves.act([], 13.0) == []  # the node moved one less than a window ago
    node.running = False
    assert node.moves.act([], 14.5) == []
    node.running, node.nodes = True, 2
    assert node.moves.act([], 15.0) == []
    node.nodes = 1
    assert len(node.moves.act([], 15.0)) == 1 and len(node.started) == 2


def test_the_rules_first_match() -> None:
    base = dict(sustained=True, moved_recently=False, tried_recently=False, running=True, busy=False, one_node=True)
    assert decide(Facts(**base)).decision == MOVE
    for fact, value in [("sustained", False), ("busy", True), ("moved_recently", True), ("tried_recently", True),
                        ("running", False), ("one_node", False)]:
        assert decide(Facts(**{**base, fact: value})).decision == WAIT, fact
