"""The tests of tests/e2e/controller/test_eviction.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: Finished jobs, and jobs no agent registers for, are
evicted (memory and state file) so a long-running
"""

from __future__ import annotations

from pathlib import Path

from support import ManualClock
from support.controller import ok, rows_of

from taskd.controller.core import ControllerCore
from taskd.controller.machine.state_machine import AgentFinished, AgentRegistered, JobInit, MachineConfig
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.store import Store
from taskd.vocabulary import Code


def make_core(state: Path, clock: ManualClock, max_jobs: int = 10000) -> ControllerCore:
    cfg = MachineConfig(unregistered_job_timeout=300, agent_loss_timeout=3600)
    return ControllerCore(cfg, Store(state), SignalHub(), max_jobs=max_jobs, clock=clock, wall=clock,
                          finished_job_retention=3600)


def test_a_job_no_agent_registers_for_is_dropped_and_stays_gone(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    clock = ManualClock()
    core = make_core(state, clock)
    ok(core.init_job("idle", JobInit(node_count=2)))
    ok(core.init_job("live", JobInit(node_count=2)))
    ok(core.dispatch("live", AgentRegistered(node_rank=0, host="h", pid=1)))  # one agent is enough
    clock.now += 299
    ok(core.init_job("idle", JobInit(node_count=2)))  # calling Init again does not keep it
    assert core.evict_expired() == []
    clock.now += 1
    assert core.evict_expired() == ["idle"]
    assert sorted(core.jobs) == ["live"] and set(rows_of(state, "idle").values()) == {0}
    assert "no agent registered within 300s" in core.job_list("idle").status.info
    core.store.close()

    restarted = make_core(state, clock)
    assert restarted.load() == 1 and sorted(restarted.jobs) == ["live"]  # not back after a restart
    restarted.store.close()


def test_an_agentless_job_keeps_its_clock_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    clock = ManualClock()
    core = make_core(state, clock)
    ok(core.init_job("idle", JobInit()))
    core.store.close()
    clock.now += 200  # the controller was down meanwhile
    restarted = make_core(state, clock)
    restarted.load()
    clock.now += 99
    assert restarted.evict_expired() == []
    clock.now += 1  # 300 s after its Init, not 300 s after the restart
    assert restarted.evict_expired() == ["idle"] and set(rows_of(state, "idle").values()) == {0}
    restarted.store.close()


def test_a_full_table_evicts_jobs_without_agents_first(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    clock = ManualClock()
    core = make_core(state, clock, max_jobs=4)
    ok(core.init_job("done", JobInit()))
    ok(core.dispatch("done", AgentRegistered(node_rank=0, host="h", pid=1)))
    ok(core.dispatch("done", AgentFinished(node_rank=0)))  # SUCCEEDED, idle: evictable too, but has a history
    ok(core.init_job("live", JobInit()))
    ok(core.dispatch("live", AgentRegistered(node_rank=0, host="h", pid=2)))
    for job in ("empty-1", "empty-2"):
        clock.now += 1
        ok(core.init_job(job, JobInit()))
    clock.now += 1
    ok(core.init_job("new-1", JobInit()))  # the agentless job held the longest makes room, not the finished one
    assert sorted(core.jobs) == ["done", "empty-2", "live", "new-1"]
    assert rows_of(state, "empty-1")["jobs"] == 0
    ok(core.dispatch("new-1", AgentRegistered(node_rank=0, host="h", pid=3)))
    ok(core.init_job("new-2", JobInit()))
    assert "empty-2" not in core.jobs and "done" in core.jobs
    ok(core.dispatch("new-2", AgentRegistered(node_rank=0, host="h", pid=4)))
    ok(core.init_job("new-3", JobInit()))  # no agentless job left: the finished one goes
    assert sorted(core.jobs) == ["live", "new-1", "new-2", "new-3"]
    ok(core.dispatch("new-3", AgentRegistered(node_rank=0, host="h", pid=5)))
    assert core.init_job("new-4", JobInit()).code == Code.TOO_MANY_JOBS  # every job has an agent and runs
    core.store.close()


def test_ten_thousand_inits_without_agents_do_not_lock_out_a_real_job(tmp_path: Path) -> None:
    """The chaos probe's table filler: the Inits evict one another, a real job still gets in and keeps its place."""
    state = tmp_path / "ctl.sqlite3"
    clock = ManualClock()
    core = make_core(state, clock, max_jobs=100)
    ok(core.init_job("real", JobInit()))
    ok(core.dispatch("real", AgentRegistered(node_rank=0, host="h", pid=1)))
    for i in range(1000):
        ok(core.init_job(f"junk-{i}", JobInit()))
    assert len(core.jobs) == 100 and "real" in core.jobs
    ok(core.init_job("late", JobInit()))
    ok(core.dispatch("late", AgentRegistered(node_rank=0, host="h", pid=2)))
    clock.now += 300
    assert len(core.evict_expired()) == 98 and sorted(core.jobs) == ["late", "real"]
    core.store.close()
