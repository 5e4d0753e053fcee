"""Finished jobs, and jobs no agent registers for, are evicted (memory and state file) so a long-running
controller never fills up."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import wait_for
from support.controller import ALL, ok, rows_of
from support.scripted_agent import ScriptedAgent

from taskd.cli import main as taskd_main
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.vocabulary import Code


def config(path: Path, **kw: object) -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.3, stop_timeout=60,
                            strategy_timeout=60, recover_timeout=60, resume_timeout=60, **kw)  # type: ignore[arg-type]


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


