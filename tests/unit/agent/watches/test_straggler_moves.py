"""`--migrate-stragglers`' decisions (taskd/agent/watches/straggler_moves.py): pure, on a clock of the test's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from taskd.agent.ranks.table import RankState
from taskd.agent.watches.straggler_moves import MOVE, WAIT, WINDOW_REPORTS, Facts, StragglerMoves, decide
from taskd.agent.watches.stragglers import StragglerWatch
from taskd.pace import RankPace, Verdict

INTERVAL = 1.0  # a window is four: 4 s
WINDOW = WINDOW_REPORTS * INTERVAL
RECORDS = Path(__file__).parent / "pace_records"


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
        self.moves = StragglerMoves(3.0, INTERVAL, lambda: {0, 1, 2, 3}, self.start, lambda: self.running,
                                    lambda: self.active, lambda: self.nodes == 1)

    def start(self, migration: str, rank: int, now: float) -> bool:
        (self.started if self.spare else self.refused).append((migration, rank))
        self.active = self.spare
        return self.spare

    def report(self, now: float, ratios: dict[int, float]) -> None:
        """One pace report: each rank's compute seconds per step as `ratios` x 0.02 (the others: 0.02)."""
        self.moves.standing([RankPace(r, "h", 0.02 * ratios.get(r, 1.0), 10) for r in (0, 1, 2, 3)], now)

    def reports(self, start: float, end: float, ratios: dict[int, float]) -> list[str]:
        """A report every INTERVAL from `start` to `end` (both in), each followed by the sweep's decision."""
        out = []
        for i in range(int(round((end - start) / INTERVAL)) + 1):
            self.report(start + i * INTERVAL, ratios)
            out += self.moves.act([], start + i * INTERVAL)
        return out


def test_a_straggler_moves_once_it_was_over_the_factor_at_every_report_for_a_whole_window() -> None:
    node = Node()
    node.report(10.0, {1: 5.0})
    assert node.moves.act([slow()], 10.0) == []  # judged now: not sustained
    assert node.reports(11.0, 10.0 + WINDOW - 1, {1: 5.0}) == []
    assert node.moves.act([], 10.0 + WINDOW + 0.5) == []  # the window passed, but no report has said so yet
    node.report(10.0 + WINDOW, {1: 5.0})
    [migration] = node.moves.act([], 10.0 + WINDOW)
    assert migration.startswith("straggler-") and node.started == [(migration, 1)]
    node.active = False  # the migration ended; its successor is judged afresh: no second move without a verdict
    assert node.reports(20.0, 30.0, {1: 5.0}) == [] and len(node.started) == 1


def test_one_report_under_the_factor_starts_the_window_again() -> None:
    """The judge's verdict stands down to 0.8 F (hysteresis): a rank that reads 2.9x once in a window is not
    sustained, though never cleared."""
    node = Node()
    node.report(10.0, {1: 5.0})
    node.moves.act([slow()], 10.0)
    node.reports(11.0, 12.0, {1: 5.0})
    assert node.reports(13.0, 13.0, {1: 2.9}) == []
    assert node.reports(14.0, 13.0 + WINDOW, {1: 5.0}) == []
    assert len(node.reports(14.0 + WINDOW, 14.0 + WINDOW, {1: 5.0})) == 1


def test_a_slow_step_must_have_left_the_pace_window_too() -> None:
    """One stall of the host stays in the judge's 10-step window: a straggler whose steps take 0.8 s of compute
    is sustained after 10 x 0.8 s, not after the 4 s window."""
    node = Node()
    node.report(10.0, {1: 5.0})
    node.moves.act([slow(seconds=0.8)], 10.0)
    assert node.reports(11.0, 17.0, {1: 5.0}) == [] and len(node.reports(18.0, 18.0, {1: 5.0})) == 1


def test_no_figure_for_the_rank_ends_its_streak_as_under_the_factor_does() -> None:
    """A rank absent from a report (restarted, too new) is dropped by the judge silently, with no cleared verdict:
    the streak must not outlive it."""
    node = Node()
    node.report(10.0, {1: 5.0})
    node.moves.act([slow()], 10.0)
    node.moves.standing([RankPace(r, "h", 0.02, 10) for r in (0, 2, 3)], 11.0)
    assert node.reports(12.0, 11.0 + WINDOW, {1: 5.0}) == []


def test_a_rank_cleared_within_the_window_is_not_moved() -> None:
    node = Node()
    node.report(10.0, {1: 5.0})
    node.moves.act([slow()], 10.0)
    node.moves.act([slow(cleared=True)], 11.0)
    assert node.reports(11.0, 20.0, {1: 5.0}) == [] and not node.started


def test_no_spare_no_move_and_the_next_try_a_window_later() -> None:
    """`Migrations.start` refuses (and reports why) when no spare is ready: nothing changes, and the rank is tried
    again no sooner than a window later."""
    node = Node(spare=False)
    node.report(10.0, {1: 5.0})
    node.moves.act([slow()], 10.0)
    assert node.reports(11.0, 10.0 + WINDOW, {1: 5.0}) == [] and len(node.refused) == 1
    node.reports(11.0 + WINDOW, 9.0 + 2 * WINDOW, {1: 5.0})
    assert len(node.refused) == 1  # not within the window
    node.spare = True
    assert len(node.reports(10.0 + 2 * WINDOW, 10.0 + 2 * WINDOW, {1: 5.0})) == 1 and len(node.started) == 1


def test_one_move_a_window_on_a_node_and_none_during_a_recovery_or_on_many_nodes() -> None:
    node = Node()
    node.report(10.0, {0: 5.0, 1: 5.0})  # two of four at 5x: each one's peers' median is 0.02 s
    node.moves.act([slow(0), slow(1)], 10.0)
    assert len(node.reports(11.0, 10.0 + WINDOW, {0: 5.0, 1: 5.0})) == 1
    node.active = False
    assert node.reports(11.0 + WINDOW, 13.0 + WINDOW, {0: 5.0, 1: 5.0}) == []  # moved less than a window ago
    node.running = False
    assert node.reports(14.0 + WINDOW, 14.0 + WINDOW, {0: 5.0, 1: 5.0}) == []
    node.running, node.nodes = True, 2
    assert node.reports(15.0 + WINDOW, 15.0 + WINDOW, {0: 5.0, 1: 5.0}) == []
    node.nodes = 1
    assert len(node.reports(16.0 + WINDOW, 16.0 + WINDOW, {0: 5.0, 1: 5.0})) == 1 and len(node.started) == 2


def test_the_rules_first_match() -> None:
    base = dict(sustained=True, moved_recently=False, tried_recently=False, running=True, busy=False, one_node=True)
    assert decide(Facts(**base)).decision == MOVE
    for fact, value in [("sustained", False), ("busy", True), ("moved_recently", True), ("tried_recently", True),
                        ("running", False), ("one_node", False)]:
        assert decide(Facts(**{**base, fact: value})).decision == WAIT, fact


def replay(record: str) -> tuple[list[tuple[float, int]], list[Verdict]]:
    """The agent's straggler watch and mover (judging locally, --straggler-factor 3, --straggler-interval 1) fed a
    recording sweep by sweep: the moves it starts (seconds, rank), and the judge's verdicts."""
    moved: list[tuple[float, int]] = []
    moves = StragglerMoves(3.0, 1.0, lambda: {0, 1}, lambda m, rank, now: moved.append((now, rank)) is None,
                           lambda: True, lambda: False, lambda: True)
    watch = StragglerWatch(3.0, 1.0, "h", moves)
    rows = [line.split() for line in (RECORDS / record).read_text().splitlines() if not line.startswith("#")]
    sweeps: dict[float, dict[int, tuple[int, float, int]]] = {}
    for t, rank, pid, compute, intervals in rows:  # a sweep reads every rank within a few ms
        at = next((s for s in sweeps if abs(s - float(t)) < 0.05 and int(rank) not in sweeps[s]), float(t))
        sweeps.setdefault(at, {})[int(rank)] = (int(pid), float(compute), int(intervals))
    verdicts = []
    for now, ranks in sweeps.items():
        table = [SimpleNamespace(global_rank=r, pid=pid, state=RankState.RUNNING) for r, (pid, _, _) in ranks.items()]
        beats = {r: SimpleNamespace(compute=c, compute_intervals=n, beats=n + 1) for r, (_, c, n) in ranks.items()}
        verdicts += watch.sweep(table, lambda rank, b=beats: b[rank.global_rank], None, now)  # type: ignore[arg-type]
    return moved, verdicts


def test_a_loaded_host_with_no_slow_rank_moves_nothing() -> None:
    """Recorded: a 2-rank job with no slow rank and ms of compute a step, on a host at load 20-30. Stalls of the
    host landed in one rank's compute time for a second or two at a time (3-12x its peer's): the judge names a
    straggler again and again, and the mover that moved a verdict standing for a window (2 s then) moved rank 1
    at 15.1 s and rank 0 at 22.1 s. Over the factor at every report for a whole window, it moves none."""
    moved, verdicts = replay("even_loaded.txt")
    assert {v.rank for v in verdicts if not v.cleared} == {0, 1}  # the judge was fooled, each rank in turn
    assert moved == []


def test_a_recorded_slow_rank_moves_once() -> None:
    """Recorded: rank 1 sleeps 0.8 s more a step than its peer's 0.2 s (5x), same host, load 25."""
    moved, verdicts = replay("slow_rank1.txt")
    assert [v.rank for v in verdicts] == [1] and [r for _, r in moved] == [1]
    assert 8.0 <= moved[0][0] - 0.0 <= 20.0
