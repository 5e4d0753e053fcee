"""Finished jobs, and jobs no agent registers for, are evicted (memory and state file) so a long-running
controller never fills up."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from scripted_agent import ScriptedAgent
from support import wait_for

from taskd.cli import main as taskd_main
from taskd.controller.core import ControllerCore
from taskd.controller.hub import SignalHub
from taskd.controller.server import ControllerConfig, EmbeddedController
from taskd.controller.state_machine import AgentFinished, AgentRegistered, JobInit, MachineConfig
from taskd.controller.store import JOB_TABLES, Store
from taskd.vocabulary import Code

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def config(path: Path, **kw: object) -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.3, stop_timeout=60,
                            strategy_timeout=60, recover_timeout=60, resume_timeout=60, **kw)  # type: ignore[arg-type]


def rows_of(path: Path, job_id: str) -> dict[str, int]:
    """Rows per table for the job, read from the state file by a second connection."""
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE job_id=?", (job_id,)).fetchone()[0]
                for t in JOB_TABLES}


def exists(probe: ScriptedAgent, job_id: str) -> bool:
    return probe.list_jobs(job_id).status.code == 0


def streams_closed(probe: ScriptedAgent, job_id: str) -> bool:
    """The controller saw every stream of the job end (or has already evicted it)."""
    jobs = probe.list_jobs(job_id).jobs
    return not jobs or not any(a.subscribed for a in jobs[0].agents)


def finish(agents: list[ScriptedAgent], probe: ScriptedAgent, close: bool = True) -> None:
    for a in agents:
        ok(a.finished(0))
    assert probe.list_jobs(agents[0].job_id).jobs[0].state == "SUCCEEDED"
    if close:
        for a in agents:
            a.close()
        wait_for(lambda: streams_closed(probe, agents[0].job_id), what=f"streams of {agents[0].job_id} to close")


@pytest.mark.usefixtures("taskd_logging")
def test_finished_idle_job_is_evicted_after_the_retention_and_stays_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state, finished_job_retention=1.0)) as ctl:
        probe = ScriptedAgent(ctl.address, "probe")
        short = ScriptedAgent(ctl.address, "short").join()
        ok(short.fault({0: 1}))
        short.expect("stopTrain")
        ok(short.stop_complete())
        short.expect("globalFault")
        ok(short.strategies(ALL))
        short.expect("changeStrategy", "recover")
        ok(short.status("recover"))
        long = ScriptedAgent(ctl.address, "long").join()  # running, its stream open: never evicted
        long_failed = ScriptedAgent(ctl.address, "failed-but-watched").join()
        ok(long_failed.finished(3, "rank 0 exited 3"))  # FAILED, but its stream stays open
        finish([short], probe)

        wait_for(lambda: not exists(probe, "short"), timeout=30, what="job short to be evicted")
        assert exists(probe, "long") and exists(probe, "failed-but-watched")
        assert probe.list_jobs("failed-but-watched").jobs[0].state == "FAILED"
        assert set(rows_of(state, "short").values()) == {0}  # every table, history included
        assert rows_of(state, "long")["jobs"] == 1

        assert taskd_main(["status", "--server", ctl.address, "--job", "short"]) == 1
        out = capsys.readouterr().out
        assert "402" in out and "short does not exist" in out and "evicted" in out
        for a in (probe, long, long_failed):
            a.close()

    with EmbeddedController(config(state, finished_job_retention=1.0)) as ctl:  # a restart does not bring it back
        probe = ScriptedAgent(ctl.address, "probe")
        assert not exists(probe, "short") and exists(probe, "long")
        again = ScriptedAgent(ctl.address, "short")
        status = again.init()
        assert status.code == 0 and "created" in status.info
        ok(again.register())
        job = probe.list_jobs("short").jobs[0]  # the reused id starts fresh: no rounds, restarts, old events
        assert job.state == "RUNNING" and job.restarts == 0 and not job.rounds
        assert [e.kind for e in job.events].count("job_created") == 1
        assert "fault_reported" not in [e.kind for e in job.events]
        for a in (probe, again):
            a.close()


def test_full_table_evicts_the_longest_idle_finished_job_and_refuses_only_when_all_run(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state, max_jobs=3, finished_job_retention=3600)) as ctl:
        probe = ScriptedAgent(ctl.address, "probe")
        j1 = ScriptedAgent(ctl.address, "j1").join()
        j2 = ScriptedAgent(ctl.address, "j2").join()
        finish([j1], probe)
        finish([j2], probe)
        j3 = ScriptedAgent(ctl.address, "j3").join()

        j4 = ScriptedAgent(ctl.address, "j4").join()  # full: j1, idle the longest, makes room
        assert not exists(probe, "j1") and exists(probe, "j2")
        assert rows_of(state, "j1")["jobs"] == 0 and rows_of(state, "j2")["jobs"] == 1
        j5 = ScriptedAgent(ctl.address, "j5").join()
        assert not exists(probe, "j2")
        assert sorted(j.jobId for j in probe.list_jobs().jobs) == ["j3", "j4", "j5"]

        j6 = ScriptedAgent(ctl.address, "j6")
        refused = j6.init()
        assert refused.code == Code.TOO_MANY_JOBS
        assert "3" in refused.info and "--max-jobs" in refused.info and "wait for a job to end" in refused.info

        finish([j4], probe, close=False)  # finished, but its agent's stream is still open: not evicted
        refused = j6.init()
        assert refused.code == Code.TOO_MANY_JOBS and "still have agents connected" in refused.info
        j4.close()
        wait_for(lambda: streams_closed(probe, "j4"), what="j4's stream to close")
        status = j6.init()
        assert status.code == 0 and "created" in status.info
        assert sorted(j.jobId for j in probe.list_jobs().jobs) == ["j3", "j5", "j6"]
        assert rows_of(state, "j4")["jobs"] == 0
        for a in (probe, j1, j2, j3, j5, j6):
            a.close()


# ---------------------------------------------------------------------------- jobs no agent registers for (H4)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_core(state: Path, clock: Clock, max_jobs: int = 10000) -> ControllerCore:
    cfg = MachineConfig(unregistered_job_timeout=300, agent_loss_timeout=3600)
    return ControllerCore(cfg, Store(state), SignalHub(), max_jobs=max_jobs, clock=clock,
                          finished_job_retention=3600)


def test_a_job_no_agent_registers_for_is_dropped_and_stays_gone(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    clock = Clock()
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
    clock = Clock()
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
    clock = Clock()
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
    clock = Clock()
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
