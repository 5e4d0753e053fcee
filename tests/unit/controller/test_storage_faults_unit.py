"""The tests of tests/e2e/controller/test_storage_faults.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: Storage faults (issue 11, H3/H2): a change the state
file cannot take is refused with its real cause, memory
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ManualClock
from support.controller import ALL, BIG, disk, memory, ok

from taskd.controller.core import STORE_RETRY, ControllerCore
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    AgentRegistered,
    Event,
    FaultReported,
    JobInit,
    JobMachine,
    MachineConfig,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
    Tick,
)
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.checkpoint import Checkpoint
from taskd.controller.storage.snapshot import snapshot
from taskd.controller.storage.store import Store, StoreError
from taskd.vocabulary import Code


def make_core(state: Path, clock: ManualClock) -> ControllerCore:
    # agents here never open a stream: a loss timeout longer than the test keeps them from being lost
    return ControllerCore(MachineConfig(stop_timeout=60, agent_loss_timeout=3600), Store(state), SignalHub(),
                          clock=clock, wall=clock)


def test_a_rank_sqlite_cannot_hold_is_refused_with_memory_unchanged(tmp_path: Path) -> None:
    """Validation bounds rank ids at the service; the store must still not be left behind memory if one passed."""
    state = tmp_path / "ctl.sqlite3"
    core = make_core(state, ManualClock())
    ok(core.init_job("j", JobInit(node_count=1)))
    ok(core.dispatch("j", AgentRegistered(node_rank=0, host="h", pid=1)))
    m = core.jobs["j"]
    for rank in (2**63, 2**80):
        out = core.dispatch("j", FaultReported(node_rank=0, faults={rank: "1"}))
        assert out.code == Code.STORAGE_ERROR and "too large" in out.info and not out.signals
        assert (m.state.value, m.round, m.queued, m.round_counter) == ("RUNNING", None, {}, 0)
        assert memory(core) == disk(state)
    # past Python's own digit limit the machine itself raises (a bug's way out): memory is undone all the same
    with pytest.raises(ValueError, match="Exceeds the limit"):
        core.dispatch("j", FaultReported(node_rank=0, faults={int("9" * 5000): "1"}))
    assert (m.state.value, m.round, m.queued, m.round_counter) == ("RUNNING", None, {}, 0)
    assert memory(core) == disk(state)
    out = core.dispatch("j", FaultReported(node_rank=0, faults={0: "1"}))
    assert out.code == Code.OK and core.jobs["j"].state.value == "STOPPING"
    core.store.close()


def test_store_error_names_the_cause_not_the_failed_rollback(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctl.sqlite3")
    m = JobMachine("j", MachineConfig(), 1.0)
    store.commit(m, [], [], 1.0)
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count={pages}")
    m.info = BIG * 3
    with pytest.raises(StoreError) as err:
        store.commit(m, [], [], 2.0)
    assert "database or disk is full" in str(err.value) and "cannot rollback" not in str(err.value)
    assert str(store.path) in str(err.value) and not store.conn.in_transaction
    store.close()


def test_a_timer_event_that_cannot_be_stored_is_retried_later_not_spun_on(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    clock = ManualClock()
    core = make_core(state, clock)
    ok(core.init_job("j", JobInit(node_count=2)))
    for n in range(2):
        ok(core.dispatch("j", AgentRegistered(node_rank=n, host="h", pid=1 + n)))
    ok(core.dispatch("j", FaultReported(node_rank=0, faults={0: "1"})))
    ok(core.dispatch("j", StopComplete(node_rank=0)))  # node 1 never answers: the stop timeout goes on without it
    deadline = core.jobs["j"].deadline
    assert deadline is not None
    good, core.store = core.store, Store(state)
    core.store.conn.close()  # every write of this store fails ("Cannot operate on a closed database")
    clock.now = deadline + 1
    core.fire_due()
    assert core.jobs["j"].state.value == "STOPPING"  # the stop timeout was undone
    assert core._heap[0][0] == clock.now + STORE_RETRY  # tried again in a second, not at once
    assert memory_of(core, good) == disk(state)
    core.store = good
    core.fire_due()  # not yet: nothing happens
    assert core.jobs["j"].state.value == "STOPPING"
    clock.now += STORE_RETRY
    core.fire_due()
    assert core.jobs["j"].state.value == "COLLECTING"
    assert memory(core) == disk(state)
    good.close()


def memory_of(core: ControllerCore, store: Store) -> dict[str, Any]:
    """`memory` with a working store (the soft history is flushed through it)."""
    broken, core.store = core.store, store
    try:
        return memory(core)
    finally:
        core.store = broken


def test_a_new_job_that_cannot_be_stored_does_not_exist(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    core = make_core(state, ManualClock())
    good, core.store = core.store, Store(state)
    core.store.conn.close()
    out = core.init_job("j", JobInit(node_count=1))
    assert out.code == Code.STORAGE_ERROR and "closed database" in out.info
    assert "j" not in core.jobs and disk(state) == {}
    core.store = good
    ok(core.init_job("j", JobInit(node_count=1)))
    good.close()


def test_an_inexact_undo_reloads_the_job_from_the_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net: were a handler ever to change a per-agent set in place away from the event's node, the
    checkpoint says so and the core takes the job from the state file rather than keep a memory that differs."""
    state = tmp_path / "ctl.sqlite3"
    core = make_core(state, ManualClock())
    ok(core.init_job("j", JobInit(node_count=1)))
    ok(core.dispatch("j", AgentRegistered(node_rank=0, host="h", pid=1)))
    before = memory(core)
    monkeypatch.setattr(Checkpoint, "restore", lambda self: False)
    good, core.store = core.store, Store(state)
    core.store.conn.close()

    def load_through_good(job_id: str | None = None) -> Any:
        return good.load_jobs(job_id)

    core.store.load_jobs = load_through_good  # type: ignore[method-assign]
    out = core.dispatch("j", FaultReported(node_rank=0, faults={0: "1"}))
    assert out.code == Code.STORAGE_ERROR
    core.store = good
    assert memory(core) == before == disk(state)
    good.close()


def fingerprint(m: JobMachine) -> Any:
    """Everything an event can change, including what is never persisted (a round's per-agent answers)."""
    r = m.round
    per_round = None if r is None else (sorted(r.acks), sorted(r.reports.items()), sorted(r.statuses),
                                        sorted(r.participants), list(r.broadcast_sets), r.strategy_started_at)
    agents = sorted((n, repr(a), a.role, a.ranks_per_node, a.registered_at, a.last_seen) for n, a in m.agents.items())
    table = m.agents
    counts = (table.online_count, table.subscribed_count, table.finished_ok_count, table.first_loss_at())
    return (copy.deepcopy(snapshot(m)), m.deadline, m.last_signal, per_round, agents, counts, table.problems())


def scenario() -> Iterator[tuple[float, Event]]:
    """Three nodes through most rules of the table: rounds, merges, queued faults, timeouts, a failed strategy,
    a lost agent, a reset, a refused impostor."""
    t = 0.0
    yield t, JobInit(node_count=3, ranks_per_node=2, max_restarts=3)
    for n in range(3):
        yield t, AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=2)
        yield t, AgentConnected(node_rank=n)
    yield t, AgentRegistered(node_rank=1, host="evil", pid=9)  # refused: node 1's agent is live
    yield t, JobInit(node_count=3, node_rank=1, host="h", pid=101)  # a join
    t = 1.0
    yield t, FaultReported(node_rank=0, faults={0: "1"})
    yield t, FaultReported(node_rank=1, faults={2: "1"})  # merged
    for n in range(3):
        yield t, StopComplete(node_rank=n, faults={0: "1", 2: "1"})
    yield t, StopComplete(node_rank=0)  # a duplicate
    for n in range(3):
        yield t, StrategiesReported(node_rank=n, strategies=tuple(ALL[1:]))
    yield t, FaultReported(node_rank=2, faults={4: "1"})  # queued
    yield t, RecoverStatusReported(node_rank=0, strategy="recover")
    yield t, RecoverStatusReported(node_rank=1, strategy="recover", code=1, info="no")  # the next strategy
    for n in range(3):
        yield t, RecoverStatusReported(node_rank=n, strategy="job-rescheduling")  # then the queued fault's round
    yield t, StopComplete(node_rank=0, faults={4: "1"})
    t = 100.0
    yield t, Tick()  # stop timeout: on without nodes 1 and 2
    yield t, StrategiesReported(node_rank=0, strategies=tuple(ALL))
    for n in range(3):
        yield t, RecoverStatusReported(node_rank=n, strategy="job-rescheduling")
    yield t, AgentDisconnected(node_rank=2)
    t = 200.0
    yield t, AgentLossDue()  # node 2 lost: FAILED
    yield t, AgentFinished(node_rank=0, exit_code=1)
    yield t, JobInit(node_count=1, host="h", pid=555)  # a new run resets the failed job
    yield t, AgentRegistered(node_rank=0, host="h", pid=555)
    yield t, AgentConnected(node_rank=0)
    yield t, AgentFinished(node_rank=0)


def test_every_event_of_a_scenario_is_undone_exactly() -> None:
    m = JobMachine("j", MachineConfig(stop_timeout=60, agent_loss_timeout=30), 0.0)
    seen = set()
    for now, event in scenario():
        before = fingerprint(m)
        saved = Checkpoint(m, getattr(event, "node_rank", None))
        state = m.state
        m.handle(event, now)
        seen.add((type(event).__name__, state.value, m.state.value))
        assert saved.restore(), event
        assert fingerprint(m) == before, event
        m.handle(event, now)  # now for real
    assert m.state.value == "SUCCEEDED"
    assert len(seen) >= 20  # the scenario went through many (event, state) pairs


def test_a_job_restored_mid_round_is_undone_exactly() -> None:
    m = JobMachine("j", MachineConfig(), 0.0)
    for _, event in list(scenario())[:14]:  # registered, connected, a round in COLLECTING
        m.handle(event, 1.0)
    restored, _ = JobMachine.restore(snapshot(m), [a.copy() for a in m.agents.values()], MachineConfig(), 2.0)
    assert restored.state.value == "RESUMING"
    for n in range(3):
        before = fingerprint(restored)
        saved = Checkpoint(restored, n)
        restored.handle(AgentConnected(node_rank=n), 3.0)
        assert saved.restore() and fingerprint(restored) == before
        restored.handle(AgentConnected(node_rank=n), 3.0)
    assert restored.state.value == "STOPPING"
