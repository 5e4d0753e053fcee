"""The core keeps each job within `--max-job-bytes` (quota.py, issue 31 F5): what it counts agrees with the state
file, a refused change leaves memory and file as they were, the count survives a restart, and a job at its
quota still finishes."""

from __future__ import annotations

from pathlib import Path

from support import ManualClock
from support.controller import disk, memory, ok

from taskd.controller.core import ControllerCore
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    FaultReported,
    JobInit,
    MachineConfig,
)
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.store import Store
from taskd.vocabulary import Code


def make_core(state: Path, quota: int) -> ControllerCore:
    clock = ManualClock()
    return ControllerCore(MachineConfig(stop_timeout=3600, agent_loss_timeout=3600, join_timeout=3600),
                          Store(state), SignalHub(), clock=clock, wall=clock, max_job_bytes=quota)


def test_a_job_is_held_to_its_quota_counted_as_the_file_holds_it(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    core = make_core(state, 60_000)
    ok(core.init_job("j", JobInit(node_count=1)))
    ok(core.dispatch("j", AgentRegistered(node_rank=0, host="h", pid=1)))
    ok(core.init_job("other", JobInit(node_count=1)))
    sparse = range(0, 800, 2)  # 400 separate runs
    refused = None
    for n in range(40):
        out = core.dispatch("j", FaultReported(node_rank=0, faults={r: "1" if n % 2 == 0 else "0" for r in sparse}))
        if out.code != Code.OK:
            refused = (n, out)
            break
    assert refused is not None
    n, out = refused
    assert out.code == Code.QUOTA_EXCEEDED and n >= 2 and "--max-job-bytes" in out.info and not out.signals
    counted = core.limits.quota.used["j"]
    on_disk = core.store.job_bytes()["j"]
    assert abs(counted - on_disk) <= on_disk // 50, (counted, on_disk)  # within 2 %
    assert memory(core) == disk(state)  # the refused change was undone: memory is what the file holds
    ok(core.dispatch("other", AgentRegistered(node_rank=0, host="o", pid=2)))  # another job is not held back
    for _ in range(300):  # its agent's stream still opens and closes (never refused), its history stops at the quota
        ok(core.dispatch("j", AgentConnected(node_rank=0)))
        ok(core.dispatch("j", AgentDisconnected(node_rank=0)))
        core.flush_soft()
    held = core.store.job_bytes()["j"] + core.store.snapshot_bytes["j"]
    assert 60_000 <= held < 60_000 + 1_000, held  # 600 stream records would be ~90 KB more
    ok(core.dispatch("j", AgentFinished(node_rank=0, exit_code=0, host="h", pid=1)))  # a job at its quota ends
    core.store.close()

    again = make_core(state, 60_000)  # a restart counts the job's bytes from the file
    again.load()
    assert abs(again.limits.quota.used["j"] - core.limits.quota.used["j"]) <= on_disk // 50
    again.store.close()
