"""Storage faults (issue 11, H3/H2): a change the state file cannot take is refused with its real cause, memory
goes back to what the disk holds, nobody is signalled, and the controller keeps serving.

The faults are real: SQLite's own `PRAGMA max_page_count` makes it raise "database or disk is full" when the
file would grow, and the write-ahead log's descriptor swapped for a read-only one makes every write fail
with EBADF, which SQLite reports as "disk I/O error".
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from scripted_agent import ScriptedAgent, StreamEnded

from taskd.controller.checkpoint import Checkpoint
from taskd.controller.core import STORE_RETRY, ControllerCore
from taskd.controller.hub import SignalHub
from taskd.controller.server import ControllerConfig, EmbeddedController
from taskd.controller.snapshot import snapshot
from taskd.controller.state_machine import (
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
from taskd.controller.store import Store, StoreError
from taskd.vocabulary import Code

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]
BIG = "x" * 4000  # a text that needs new pages in the events and faults tables
T = TypeVar("T")
CORE_LOG = "taskd.controller.core"


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def config(path: Path) -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.3, stop_timeout=60,
                            strategy_timeout=60, recover_timeout=60, resume_timeout=60)


def on_loop(ctl: EmbeddedController, fn: Callable[[], T]) -> T:
    """Run `fn` on the controller's event loop (the store and the core belong to that thread)."""
    async def call() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), ctl._loop).result(10)  # type: ignore[arg-type]


def core_of(ctl: EmbeddedController) -> ControllerCore:
    assert ctl.server is not None and ctl.server.core is not None
    return ctl.server.core


def cap_pages(ctl: EmbeddedController, cap: bool) -> None:
    """Cap the state file at its current size (SQLite then raises "database or disk is full"), or lift the cap."""
    def apply() -> None:
        conn = core_of(ctl).store.conn
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # no free page to grow into
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages if cap else 1 << 30}")
    on_loop(ctl, apply)


def fd_of(path: str) -> int:
    (fd,) = [int(fd) for fd in os.listdir("/proc/self/fd")
             if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(path)]
    return fd


@contextlib.contextmanager
def broken_wal(ctl: EmbeddedController, state: Path) -> Iterator[None]:
    """The controller's write-ahead log descriptor made read-only: each write fails (EBADF, "disk I/O error")."""
    wal = str(state) + "-wal"
    fd = fd_of(wal)
    saved = os.dup(fd)

    def swap(to: int) -> None:
        os.dup2(to, fd)

    readonly = os.open(wal, os.O_RDONLY)
    on_loop(ctl, lambda: swap(readonly))
    os.close(readonly)
    try:
        yield
    finally:
        on_loop(ctl, lambda: swap(saved))
        os.close(saved)


def comparable(snap: dict[str, Any], agents: Any) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """A job as a restart restores it: its snapshot (less the activity stamp, which soft history moves) and
    its agents' identities and finishes."""
    snap = {k: v for k, v in snap.items() if k != "updated_at"}
    return snap, sorted((a.node_rank, a.host, a.pid, a.role, a.finished, a.exit_code) for a in agents)


def memory(core: ControllerCore) -> dict[str, Any]:
    core.flush_soft()
    return {job_id: comparable(snapshot(m, core.clocks.to_wall), m.agents.values()) for job_id, m in core.jobs.items()}


def disk(state: Path) -> dict[str, Any]:
    """What a restarted controller would load (read through a second connection)."""
    store = Store(state)
    try:
        return {snap["job_id"]: comparable(snap, agents) for snap, agents in store.load_jobs()}
    finally:
        store.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == CORE_LOG and r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------------- a live controller, a full disk


def test_full_disk_refuses_the_fault_with_its_cause_and_changes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    caplog.set_level(logging.INFO, logger="taskd")
    with EmbeddedController(config(state)) as ctl:
        a = [ScriptedAgent(ctl.address, "a", n, 2).join() for n in range(2)]
        b = ScriptedAgent(ctl.address, "b").join()
        before = a[0].list_jobs("a").jobs[0]
        caplog.clear()
        cap_pages(ctl, True)
        status = a[0].fault({0: 1}, detail=BIG)
        assert status.code == Code.STORAGE_ERROR == 503
        assert "database or disk is full" in status.info and "cannot rollback" not in status.info
        assert "nothing changed" in status.info
        (line,) = errors(caplog)  # one loud line, no traceback
        assert "database or disk is full" in line.getMessage() and line.exc_info is None
        for agent in a:
            agent.no_signal(0.5)  # no stopTrain for a change that was not stored
        job = a[0].list_jobs("a").jobs[0]
        assert (job.state, job.restarts, len(job.rounds), job.info) == ("RUNNING", 0, 0, before.info)
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        ok(b.health())  # the controller keeps serving while the disk is full

        cap_pages(ctl, False)  # space again: the same report now goes through, and so does the other job's
        ok(a[0].fault({0: 1}, detail=BIG))
        for agent in a:
            agent.expect("stopTrain")
        ok(b.fault({0: 1}))
        b.expect("stopTrain")
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        for agent in (*a, b):
            agent.close()
    with EmbeddedController(config(state)) as again:  # and a restart loads exactly that
        jobs = {j.jobId: j for j in ScriptedAgent(again.address, "x").list_jobs().jobs}
        assert jobs["a"].state == jobs["b"].state == "RESUMING" and len(jobs["a"].rounds) == 1


def test_full_disk_mid_round_keeps_the_round_where_it_was(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        a = [ScriptedAgent(ctl.address, "a", n, 2).join() for n in range(2)]
        ok(a[0].fault({0: 1}))
        for agent in a:
            agent.expect("stopTrain")
        ok(a[0].stop_complete())
        cap_pages(ctl, True)
        status = a[1].stop_complete(info=BIG)  # the last answer: it would move the round on to COLLECTING
        assert status.code == Code.STORAGE_ERROR and "database or disk is full" in status.info
        for agent in a:
            agent.no_signal(0.5)  # no globalFault
        assert a[0].list_jobs("a").jobs[0].state == "STOPPING"
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        round_ = on_loop(ctl, lambda: core_of(ctl).jobs["a"].round)
        assert round_ is not None and round_.acks == {0}  # node 1's answer was undone, node 0's kept
        cap_pages(ctl, False)
        ok(a[1].stop_complete())  # the agent sends it again: the round goes on from where it was
        for agent in a:
            agent.expect("globalFault")
        for agent in a:
            ok(agent.strategies(ALL))
        for agent in a:
            agent.expect("changeStrategy", "recover")  # nothing excluded by the refused answer
        for agent in a:
            agent.close()


def test_disk_io_error_refuses_with_its_cause_and_the_controller_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        a = ScriptedAgent(ctl.address, "a").join()
        b = ScriptedAgent(ctl.address, "b").join()
        caplog.clear()
        with broken_wal(ctl, state):
            status = a.fault({0: 1})
            assert status.code == Code.STORAGE_ERROR and "disk I/O error" in status.info, status.info
            assert "cannot rollback" not in status.info
            a.no_signal(0.5)
            assert a.list_jobs("a").jobs[0].state == "RUNNING"  # reads still work
            assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
            assert b.finished(0).code == Code.STORAGE_ERROR  # every write fails, the controller answers each
            assert b.list_jobs("b").jobs[0].state == "RUNNING"
        assert [r for r in errors(caplog) if "disk I/O error" in r.getMessage() and r.exc_info is None]
        ok(a.fault({0: 1}))  # the file is writable again: the same connection carries on
        a.expect("stopTrain")
        ok(b.finished(0))
        assert b.list_jobs("b").jobs[0].state == "SUCCEEDED"
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        a.close()
        b.close()


def test_a_subscription_whose_change_cannot_be_stored_is_ended_and_can_come_again(tmp_path: Path) -> None:
    """After a controller restart the last agent back resumes the round (stopTrain, a stored change). If that
    cannot be stored the stream is ended rather than left open while the job says it is not."""
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        agent = ScriptedAgent(ctl.address, "a").join()
        ok(agent.fault({0: 1}))
        agent.expect("stopTrain")
        agent.close()
    with EmbeddedController(config(state)) as ctl:
        agent = ScriptedAgent(ctl.address, "a")  # the same process, reconnecting
        ok(agent.init())
        ok(agent.register())
        with broken_wal(ctl, state):
            agent.subscribe()
            with pytest.raises(StreamEnded):
                agent.next_signal(10)  # ended, without the stopTrain of a resumption that was not stored
            job = agent.list_jobs("a").jobs[0]
            assert job.state == "RESUMING" and not job.agents[0].subscribed
            assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        agent.subscribe()
        agent.expect("stopTrain")  # the round resumes now
        assert agent.list_jobs("a").jobs[0].state == "STOPPING"
        agent.close()


# ---------------------------------------------------------------------------- the core, with a clock


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_core(state: Path, clock: Clock) -> ControllerCore:
    # agents here never open a stream: a loss timeout longer than the test keeps them from being lost
    return ControllerCore(MachineConfig(stop_timeout=60, agent_loss_timeout=3600), Store(state), SignalHub(),
                          clock=clock, wall=clock)


def test_a_rank_sqlite_cannot_hold_is_refused_with_memory_unchanged(tmp_path: Path) -> None:
    """Validation bounds rank ids at the service; the store must still not be left behind memory if one passed."""
    state = tmp_path / "ctl.sqlite3"
    core = make_core(state, Clock())
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
    clock = Clock()
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
    core = make_core(state, Clock())
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
    core = make_core(state, Clock())
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


# ---------------------------------------------------------------------------- the checkpoint, event by event


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
