"""`taskd migrate` on the controller's machine (controller/nodes/migration.py): who may be asked, what is sent and
recorded, and that a refusal sends nothing and changes nothing."""

from __future__ import annotations

import json

import pytest
from support.controller import running_job

from taskd.controller.machine.events import MigrationReported, MigrationRequested
from taskd.controller.machine.state_machine import FaultReported
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
