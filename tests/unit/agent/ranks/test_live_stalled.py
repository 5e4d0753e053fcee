"""A rank its peers' timed-out collective waited for is a hang (`LiveRanks.stalled`), but only while the
waiting rank is still in the generation it timed out in. Seen in a benchmark run: a survivor stuck in the old
group's collective timed out 60 s later, after the recovery had re-formed the group without waiting for it,
and the agent then killed a healthy rank of the new group as "hung"."""

from __future__ import annotations

import time
from pathlib import Path

from support.live_files import FakeNode, running_ranks, write

from taskd.agent.ranks.live import LiveRanks
from taskd.agent.ranks.table import RankLayout, RankTable
from taskd.worker import heartbeat_file as hbf
from taskd.worker.live import _ERROR, _JOIN, _U32, ErrorKind, Phase

PIDS = {0: 5001, 1: 5002}


def joined(node: FakeNode, local: int, generation: int) -> None:
    write(node.heartbeat_path(local), (hbf.IDENT, hbf.OFF_IDENT, (PIDS[local], 0)),
          (_JOIN, hbf.OFF_LIVE_JOIN, (generation, 5, time.time())), (_U32, hbf.OFF_LIVE_PHASE, (int(Phase.TRAINING),)))


def timed_out(node: FakeNode, local: int) -> None:
    write(node.heartbeat_path(local),
          (_ERROR, hbf.OFF_LIVE_ERROR, (1, int(ErrorKind.COLLECTIVE_TIMEOUT), 5, time.time())),
          (_U32, hbf.OFF_LIVE_PHASE, (int(Phase.PAUSED),)))


def two_ranks(tmp: Path) -> tuple[LiveRanks, FakeNode, RankTable]:
    node, table = running_ranks(tmp, RankLayout(0, 1, (0, 1)), PIDS)
    for local in PIDS:
        joined(node, local, 0)
    return LiveRanks(table, node), node, table  # type: ignore[arg-type]


def test_a_rank_its_peer_timed_out_waiting_for_in_the_current_generation_is_stalled(tmp_path: Path) -> None:
    live, node, table = two_ranks(tmp_path)
    timed_out(node, 0)
    assert live.new_errors() == []  # not a fault of its own: what it waited for is
    assert [rank.local_rank for rank, _ in live.stalled()] == [1]


def test_a_timeout_in_a_generation_the_rank_has_left_since_accuses_nobody(tmp_path: Path) -> None:
    live, node, table = two_ranks(tmp_path)
    timed_out(node, 0)  # its old group's collective timed out ...
    live.new_errors()
    joined(node, 0, 3)  # ... and it has joined the re-formed group since, as rank 1 has
    joined(node, 1, 3)
    assert live.stalled() == []
    assert live.stalled() == []  # and the stale timeout is forgotten
    assert not live._timed_out


def test_a_timeout_read_only_after_the_rank_joined_a_newer_generation_accuses_nobody(tmp_path: Path) -> None:
    """Seen in a whole-suite run (test_node_loss_resize): an old group's collective timed out 30 s into a scale-out,
    the rank then joined the new group at once, and the agent read both together: the timeout was taken for the
    new group's, and a healthy rank of it was killed as hung."""
    live, node, table = two_ranks(tmp_path)
    timed_out(node, 0)  # its old group's collective timed out ...
    time.sleep(0.01)
    joined(node, 0, 3)  # ... and it joined the re-formed group, before the agent's next read
    joined(node, 1, 3)
    assert live.new_errors() == []
    assert live.stalled() == []
