"""A live group's rank that exits 0 before its loop's end (issue 21, "leaving early"): a fault when its peers'
group breaks, a finish when they stop too (early stopping) or never wait on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskd.agent.ranks.table import RankLayout, RankState, RankTable
from taskd.agent.watches.exits import HOLD, WATCH, DepartureWatch
from taskd.worker import heartbeat_file as hbf
from taskd.worker.live import Phase, RankStatus, read_rank_status


@pytest.fixture
def blank(tmp_path: Path) -> RankStatus:
    """A heartbeat file as a rank leaves it, read the agent's way; each test sets the fields it is about."""
    path = str(tmp_path / "rank.hb")
    hbf.HeartbeatFile(path).create().close()
    status = read_rank_status(path)
    return status._replace(can_rejoin=True, declared=True, heartbeat=status.heartbeat._replace(step=4))


def job() -> tuple[RankTable, DepartureWatch]:
    table = RankTable()
    table.lay_out(RankLayout(0, 1, (0, 1, 2)))
    for local, rank in table.ranks.items():
        rank.pid, rank.state = 100 + local, RankState.RUNNING
    return table, DepartureWatch(table)


def exit0(table: RankTable, watch: DepartureWatch, local: int, status: RankStatus, at: float) -> bool:
    """What the supervisor does on an exit 0: note it, then mark the rank finished."""
    watched = watch.exited(table[local], status, in_group=True, now=at, mono=at)
    table[local].state = RankState.SUCCEEDED
    return watched


def test_peers_that_lost_their_group_give_the_early_exit_away_as_a_fault(blank: RankStatus) -> None:
    table, watch = job()
    assert exit0(table, watch, 1, blank, at=100.0)
    running = {0: blank, 2: blank}
    assert watch.left(running, now=100.01, mono=100.01) == []  # the peers still compute: nothing yet
    found = watch.left({0: blank._replace(phase=Phase.PAUSED), 2: blank}, now=100.05, mono=100.05)
    assert [(d.rank.global_rank, d.step) for d, _ in found] == [(1, 4)]
    assert "rank(s) [0] lost their group" in found[0][1]
    assert watch.left({0: blank._replace(phase=Phase.PAUSED)}, now=100.1, mono=100.1) == []  # judged once


def test_a_peer_waiting_in_a_collective_since_the_exit_gives_it_away_after_the_hold(blank: RankStatus) -> None:
    table, watch = job()
    exit0(table, watch, 2, blank, at=100.0)
    waiting = {0: blank._replace(collective_since=99.0), 1: blank}
    assert watch.left(waiting, now=100.0 + HOLD / 2, mono=100.0 + HOLD / 2) == []  # may end with the job
    found = watch.left(waiting, now=100.0 + HOLD, mono=100.0 + HOLD)
    assert [d.rank.global_rank for d, _ in found] == [2] and "rank(s) [0] wait on it" in found[0][1]


def test_early_stopping_every_rank_breaking_out_is_no_fault(blank: RankStatus) -> None:
    table, watch = job()
    assert exit0(table, watch, 0, blank, at=100.0)
    assert exit0(table, watch, 1, blank, at=100.01)
    assert not exit0(table, watch, 2, blank, at=100.02)  # the last one out leaves nobody
    assert watch.left({}, now=100.03, mono=100.03) == [] and not watch.watching


def test_peers_that_train_on_without_waiting_for_it_drop_the_watch_after_its_bound(blank: RankStatus) -> None:
    table, watch = job()
    exit0(table, watch, 1, blank, at=100.0)
    assert watch.left({0: blank, 2: blank}, now=100.0 + WATCH - 0.1, mono=100.0 + WATCH - 0.1) == [] \
        and watch.watching
    assert watch.left({0: blank, 2: blank}, now=100.0, mono=100.0 + WATCH) == [] and not watch.watching  # monotonic


def test_a_rank_whose_loop_ran_to_its_end_or_that_is_in_no_group_is_not_watched(blank: RankStatus) -> None:
    table, watch = job()
    assert not watch.exited(table[0], blank._replace(phase=Phase.COMPLETE), in_group=True)
    assert not watch.exited(table[0], blank, in_group=False)  # independent ranks: nobody waits on them
    assert not watch.exited(table[0], blank._replace(can_rejoin=False), in_group=True)
    assert not watch.exited(table[0], None, in_group=True)


def test_a_departure_whose_rank_was_restarted_meanwhile_is_dropped(blank: RankStatus) -> None:
    table, watch = job()
    exit0(table, watch, 1, blank, at=100.0)
    table[1].pid, table[1].state = 200, RankState.RUNNING  # judged and replaced by another path
    assert watch.left({0: blank._replace(phase=Phase.PAUSED)}, now=100.1, mono=100.1) == [] and not watch.watching
