"""`taskd migrate` on the controller's machine (controller/nodes/migration.py): who may be asked, what is sent and
recorded, and that a refusal sends nothing and changes nothing."""

from __future__ import annotations

import json

import pytest
from support.controller import running_job

from taskd.controller.machine.events import (
    MigrationReported,
    MigrationRequested,
    StandbyConnected,
    StandbyDisconnected,
)
from taskd.controller.machine.state_machine import AgentRegistered, FaultReported, JobMachine
from taskd.controller.service.hub import extra_params
from taskd.vocabulary import Code, SignalType


def test_a_running_one_node_job_asks_the_ranks_agent_with_a_new_generation() -> None:
    m = running_job(nodes=1, per_node=4)
    seq = m.signal_seq
    out = m.handle(MigrationRequested(rank=2), 1.0)
    assert out.code == Code.OK and [s.signal_type for s in out.signals] == [SignalType.MIGRATE]
    sig = out.signals[0]
    assert sig.nodes == (0,) and out.info == sig.uuid and m.state.value == "RUNNING"
    assert json.loads(extra_params(sig)) == {"rank": 2, "generation": seq + 1} and sig.generation == seq + 1
    assert [r.kind for r in out.records] == ["migration_requested"]
    assert m.last_signal is None or m.last_signal.signal_type != SignalType.MIGRATE  # never re-sent as a round's


def test_refusals_send_nothing_and_say_why() -> None:
    m = running_job(nodes=1, per_node=4)
    for rank, code, words in ((4, Code.INVALID_PARAMS, "rank 4 is not a rank of job j (0..3)"),
                              (-1, Code.INVALID_PARAMS, "rank -1 is not a rank")):
        out = m.handle(MigrationRequested(rank=rank), 1.0)
        assert (out.code, out.signals, out.records) == (code, [], []) and words in out.info
    two = running_job(nodes=2, per_node=2)
    out = two.handle(MigrationRequested(rank=1), 1.0)
    assert out.code == Code.OUT_OF_ORDER and "2 nodes" in out.info and not out.signals
    m.handle(FaultReported(node_rank=0, faults={1: "1"}, host="h", pid=100), 2.0)  # a round opens
    out = m.handle(MigrationRequested(rank=1), 3.0)
    assert out.code == Code.OUT_OF_ORDER and "STOPPING, not RUNNING" in out.info and not out.signals


def test_the_agents_account_is_one_event() -> None:
    m = running_job(nodes=1, per_node=4)
    done = m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration="j-0-1", migrated=True, rank=2,
                                      old_pid=11, new_pid=12, step=40, pause_seconds=0.25, generation=1), 1.0)
    assert done.code == Code.OK and [(r.kind, r.detail["pause_seconds"], r.detail["new_pid"]) for r in done.records] \
        == [("migrated", 0.25, 12)]
    failed = m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration="j-0-2", rank=2,
                                        reason="no warm spare is ready"), 2.0)
    assert [(r.kind, r.detail["reason"]) for r in failed.records] == [("migration_failed", "no warm spare is ready")]
    assert m.state.value == "RUNNING" and m.restarts == 0


def test_the_event_names_its_trigger_and_the_metrics_count_it() -> None:
    """An agent's own move of a straggler (`--migrate-stragglers`: its id starts "straggler-") against one of
    `taskd migrate`'s; `taskd_migrations_total` counts both by trigger and outcome."""
    pytest.importorskip("prometheus_client")
    from taskd.controller.metrics import ControllerMetrics

    m = running_job(nodes=1, per_node=2)
    records = [*m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration="straggler-0123456789ab",
                                           migrated=True, rank=1, old_pid=11, new_pid=12, step=9), 1.0).records,
               *m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration="straggler-ba9876543210",
                                           rank=1, reason="no warm spare is ready"), 2.0).records,
               *m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration="j-0-1", rank=0,
                                           reason="no warm spare is ready"), 3.0).records]
    assert [(r.kind, r.detail["trigger"]) for r in records] == [
        ("migrated", "straggler"), ("migration_failed", "straggler"), ("migration_failed", "taskd migrate")]
    metrics = ControllerMetrics(lambda: [], lambda: 0)
    metrics.observe(records)
    count = metrics.registry.get_sample_value
    assert count("taskd_migrations_total", {"trigger": "straggler", "outcome": "migrated"}) == 1
    assert count("taskd_migrations_total", {"trigger": "straggler", "outcome": "failed"}) == 1
    assert count("taskd_migrations_total", {"trigger": "taskd migrate", "outcome": "failed"}) == 1


def _with_standby(nodes: int = 2) -> JobMachine:
    m = running_job(nodes=nodes, per_node=1)
    assert m.handle(AgentRegistered(node_rank=0, host="s", pid=7, standby=True, ranks_per_node=1), 0.0).code == 0
    m.handle(StandbyConnected(host="s", pid=7), 0.0)
    return m


def test_a_node_migration_is_refused_with_its_reason_and_sends_nothing() -> None:
    """Refused: no standby waits, node 0 (it hosts the store), a node outside the job; nothing sent or recorded."""
    bare = running_job(nodes=2, per_node=1)
    out = bare.handle(MigrationRequested(node=1), 1.0)
    assert out.code == Code.OUT_OF_ORDER and "no standby agent waits for job j" in out.info
    m = _with_standby()
    for node, words in ((0, "hosts the job's rendezvous store"), (2, "node 2 is not a node of job j")):
        out = m.handle(MigrationRequested(node=node), 1.0)
        assert out.code == Code.INVALID_PARAMS and words in out.info and not out.signals and not out.to_standbys
    assert m.node_move is None and all(s.assigned is None for s in m.standbys.values())


def test_a_node_migration_runs_its_stages_and_ends_in_one_event() -> None:
    """prepare (to the standby) -> ready -> go (to every node) -> the staying node's pause -> the standby registers
    as the node (no fence) -> its final account: `migrated` with the pause, and the `Migrate` call is answered."""
    m = _with_standby()
    seq = m.signal_seq
    out = m.handle(MigrationRequested(node=1), 1.0)
    [(key, prepare)] = out.to_standbys
    assert key == ("s", 7) and json.loads(extra_params(prepare)) == {"node_rank": 1, "generation": seq + 1,
                                                                      "stage": "prepare"}
    migration = out.info
    ready = m.handle(MigrationReported(node_rank=0, host="s", pid=7, migration=migration, migrated=True,
                                       stage="ready"), 2.0)
    assert ready.code == Code.OK and json.loads(extra_params(ready.signals[0]))["stage"] == "go"
    joined = m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration=migration, migrated=True,
                                        stage="joined", step=40, pause_seconds=0.25), 3.0)
    assert joined.settled is None  # the standby does not hold the node yet
    took = m.handle(AgentRegistered(node_rank=1, host="s", pid=7, ranks_per_node=1), 3.5)
    assert took.code == Code.OK and m.agents[1].pid == 7 and not m.fences and ("s", 7) not in m.standbys
    done = m.handle(MigrationReported(node_rank=1, host="s", pid=7, migration=migration, migrated=True, new_pid=7,
                                      step=40), 4.0)
    assert done.settled is not None and done.settled.migrated and done.settled.pause_seconds == 0.25
    (event,) = [r for r in done.records if r.kind == "migrated"]
    assert (event.detail["old_pid"], event.detail["pid"], event.detail["step"]) == (101, 7, 40)
    assert m.node_move is None and m.state.value == "RUNNING" and m.restarts == 0


def test_a_node_that_cannot_take_part_calls_it_off_and_the_standby_is_told_too() -> None:
    """A staying node refuses "go": every node re-forms as it was, and the standby (not a node of the job: no
    broadcast reaches it) is told "off" on its own stream, so that it stops the ranks it started and waits again."""
    m = _with_standby()
    migration = m.handle(MigrationRequested(node=1), 1.0).info
    m.handle(MigrationReported(node_rank=0, host="s", pid=7, migration=migration, migrated=True, stage="ready"), 2.0)
    out = m.handle(MigrationReported(node_rank=0, host="h", pid=100, migration=migration, migrated=False,
                                     reason="node 0 cannot take part: a recovery", stage="joined"), 3.0)
    assert [json.loads(extra_params(s))["stage"] for s in out.signals] == ["off"]
    [(key, told)] = out.to_standbys
    assert key == ("s", 7) and json.loads(extra_params(told)) | {"generation": 0} == {
        "node_rank": 1, "generation": 0, "stage": "off", "migration": migration}
    assert m.standbys[("s", 7)].assigned is None and out.settled is not None and not out.settled.migrated
    before = m.handle(MigrationRequested(node=1), 4.0)  # free again: the next migration may use it
    assert [k for k, _ in before.to_standbys] == [("s", 7)]


def test_a_standby_that_goes_away_after_go_calls_it_off() -> None:
    """Every node is told to re-form as it was (stage "off", a newer generation); the call is answered why."""
    m = _with_standby()
    migration = m.handle(MigrationRequested(node=1), 1.0).info
    m.handle(MigrationReported(node_rank=0, host="s", pid=7, migration=migration, migrated=True, stage="ready"), 2.0)
    out = m.handle(StandbyDisconnected(host="s", pid=7), 3.0)
    off = [json.loads(extra_params(s)) for s in out.signals]
    assert [o["stage"] for o in off] == ["off"] and off[0]["generation"] > m.signal_seq - 1
    assert out.settled is not None and not out.settled.migrated and "went away" in out.settled.reason
    assert m.node_move is None and [r.kind for r in out.records][-1] == "migration_failed"
