"""A replacement node's live recover (issue 17): its agent never saw its ranks, so it learns from their heartbeat
files whether each is a group joiner (wait until it joined the generation) or an independent rank (running is
enough). Before, every never-seen rank counted as independent: the replacement reported "the group re-formed"
the moment its ranks were spawned, seconds before they joined."""

from __future__ import annotations

from pathlib import Path

from support.live_files import FakeNode, running_ranks, write

from taskd.agent.ranks.live import LiveRanks
from taskd.agent.ranks.table import RankLayout, RankTable
from taskd.agent.round.events import GroupRejoined
from taskd.vocabulary import Strategy
from taskd.worker import heartbeat_file as hbf
from taskd.worker.live import _JOIN, _U32, FLAG_REJOIN, Phase

PIDS = {0: 4001, 1: 4002}


def new_node(tmp: Path) -> tuple[LiveRanks, FakeNode]:
    details, table = running_ranks(tmp, RankLayout(1, 2, (2, 3)), PIDS)
    live = LiveRanks(table, details)  # type: ignore[arg-type]
    live.next_generation(3)
    live.begin(Strategy.RECOVER, {2: "1", 3: "1"}, started=0.0, timeout=60.0, now=0.0)
    return live, details


def started(details: FakeNode, local: int, phase: Phase) -> None:
    write(details.heartbeat_path(local), (hbf.IDENT, hbf.OFF_IDENT, (PIDS[local], 0)),
          (_U32, hbf.OFF_LIVE_PHASE, (int(phase),)), (_U32, hbf.OFF_LIVE_FLAGS, (FLAG_REJOIN,)))


def test_a_new_nodes_group_ranks_have_rejoined_only_once_they_joined_the_generation(tmp_path: Path) -> None:
    live, details = new_node(tmp_path)
    assert details.generation == 3
    assert live.check(0.1) is None  # spawned, still importing: nothing declared yet
    for local in PIDS:
        started(details, local, Phase.REJOINING)  # LiveGroup: "forming a group", then its declaration
    assert live.check(0.2) is None
    for local in PIDS:
        write(details.heartbeat_path(local), (_JOIN, hbf.OFF_LIVE_JOIN, (3, 6, 1.0)),
              (_U32, hbf.OFF_LIVE_PHASE, (int(Phase.TRAINING),)))
    assert live.check(0.3) == GroupRejoined(3, 0.0)


def test_a_new_nodes_independent_ranks_have_rejoined_once_they_declared(tmp_path: Path) -> None:
    live, details = new_node(tmp_path)
    assert live.check(0.1) is None
    for local in PIDS:
        started(details, local, Phase.TRAINING)  # worker.declare_rejoinable(): no group
    assert live.check(0.2) == GroupRejoined(3, 0.0)


def test_a_replacement_times_its_recovery_from_the_controllers_declaration_of_the_loss() -> None:
    """The replacement's "training resumed N s after the fault" counts from the loss, as the survivors' does, not
    from its own start: the newest node-loss record of its node rank says when."""
    from taskd.agent.link.controller import lost_ago
    from taskd.proto import taskd_pb2

    record = taskd_pb2.JobRecord(rounds=[
        taskd_pb2.RoundRecord(round=1, nodeLosses=[taskd_pb2.NodeLossRecord(nodeRank=1, lostAt=100.0)]),
        taskd_pb2.RoundRecord(round=2, nodeLosses=[taskd_pb2.NodeLossRecord(nodeRank=0, lostAt=150.0),
                                                   taskd_pb2.NodeLossRecord(nodeRank=1, lostAt=160.0)]),
    ])
    assert lost_ago(record, 1, 163.5) == 3.5
    assert lost_ago(record, 2, 163.5) is None  # never lost
    assert lost_ago(record, 1, 150.0) == 0.0  # a clock behind the controller's: no negative duration
    # issue 32, F6: from the fault, not the declaration: plus the seconds its agent had been gone when declared
    record.events.extend([
        taskd_pb2.EventRecord(kind="node_lost", detail='{"node_rank": 1, "pid": 7, "seconds": 2.0}'),
        taskd_pb2.EventRecord(kind="node_lost", detail='{"node_rank": 0, "pid": 8, "seconds": 9.0}'),
        taskd_pb2.EventRecord(kind="node_lost", detail='{"node_rank": 1, "pid": 9, "seconds": 5.0}'),
        taskd_pb2.EventRecord(kind="node_lost", detail="not json"),
    ])
    assert lost_ago(record, 1, 163.5) == 8.5  # the newest loss of node 1: 3.5 s since declared, 5 s gone before


def test_a_survivor_does_not_offer_recover_when_node_0_and_its_store_are_lost(tmp_path: Path) -> None:
    """Node 0's agent hosts the rendezvous store: once node 0 is lost, a survivor's ranks cannot rejoin in place, so
    its node offers job-rescheduling (the replacement node 0 hosts a new store) instead of a recover that would
    wait for its rebuild deadline first."""
    details = FakeNode(tmp_path)
    table = RankTable()
    table.lay_out(RankLayout(1, 2, (2, 3)))
    live = LiveRanks(table, details)  # type: ignore[arg-type]
    live._declared = {0: (True, True), 1: (True, True)}  # both ranks declared they can rejoin
    live.refresh = lambda: {}  # type: ignore[method-assign]  (no rank files to read here)
    configured = [Strategy.RECOVER, Strategy.JOB_RESCHEDULING, Strategy.EXIT]
    assert live.offer(configured, {0: "1", 1: "1"}) == [Strategy.JOB_RESCHEDULING, Strategy.EXIT]
    assert live.offer(configured, {0: "1"}) == configured  # rank 0 alone: node 0's agent and store live on
    table.lay_out(RankLayout(0, 2, (0, 1)))
    assert live.offer(configured, {0: "1", 1: "1"}) == configured  # node 0 itself: its store lives on


def test_a_standby_is_live_once_its_launcher_has_a_node_and_a_store(tmp_path: Path) -> None:
    """A standby's launcher has no live store until the controller gives it a node rank; the agent asked once, at
    its start, and kept "not live": the standby's ranks then started into generation 0 while the survivors waited
    in the round's generation, and the job never resumed (bench/node_loss.py's standby row)."""
    node = FakeNode(tmp_path)
    node.live_recovery = False  # a standby: no node rank, no store yet
    live = LiveRanks(RankTable(), node)
    assert not live.enabled
    node.live_recovery = True  # set_node_rank opened the node's files: a store and a control file
    assert live.enabled and live.control_path == str(tmp_path / "control.json")
