"""Item 5 of issue 17 on the controller, pure: deadlines on a monotonic clock whatever the wall clock does,
stored times re-based at a restart, a late re-Init never resetting a finished job, typed generation/restarts."""

from __future__ import annotations

import json
from pathlib import Path

from support import ManualClock

from taskd.controller.clock import Clock
from taskd.controller.core import ControllerCore
from taskd.controller.machine.events import Signal
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    FaultReported,
    JobInit,
    JobMachine,
    JobState,
    MachineConfig,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.service.hub import SignalHub, extra_params
from taskd.controller.storage.store import Store
from taskd.vocabulary import SignalType

S = JobState


def two_node_core(state: str | Path, mono: ManualClock, wall: ManualClock, loss: float = 30.0) -> ControllerCore:
    cfg = MachineConfig(agent_loss_timeout=loss, agent_loss_grace=loss)
    return ControllerCore(cfg, Store(state), SignalHub(), clock=mono, wall=wall)


def start_job(core: ControllerCore, job: str = "j") -> None:
    assert core.init_job(job, JobInit(node_count=2, ranks_per_node=1)).code == 0
    for n in range(2):
        assert core.dispatch(job, AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=1)).code == 0
        assert core.dispatch(job, AgentConnected(node_rank=n)).code == 0


def test_a_wall_clock_stepped_back_an_hour_does_not_delay_an_agents_loss() -> None:
    mono, wall = ManualClock(5000.0), ManualClock(1_700_000_000.0)
    core = two_node_core(":memory:", mono, wall)
    start_job(core)
    core.dispatch("j", AgentDisconnected(node_rank=1))  # node 1's agent was SIGKILLed: its stream ended
    wall.now -= 3600  # NTP (or an operator) steps the wall clock back an hour
    mono.now += 29.9
    core.fire_due()
    assert core.jobs["j"].state == S.RUNNING  # not yet: 29.9 s of the 30 s
    mono.now += 0.2
    wall.now += 0.3
    core.fire_due()
    m = core.jobs["j"]
    assert m.state != S.RUNNING, "the loss is due 30 s after the stream ended, in monotonic time"
    core.store.close()


def test_stored_times_are_wall_times_and_come_back_rebased_never_in_the_future(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    mono, wall = ManualClock(100.0), ManualClock(1_700_000_000.0)
    core = ControllerCore(MachineConfig(join_timeout=600), Store(state), SignalHub(), clock=mono, wall=wall)
    assert core.init_job("j", JobInit(node_count=2)).code == 0
    core.dispatch("j", AgentRegistered(node_rank=0, host="h", pid=1))  # node 1 never comes: the join clock runs
    assert core.jobs["j"].join_deadline == 700.0
    core.store.close()
    (snap,), = [(json.loads(s),) for (s,) in Store(state).conn.execute("SELECT snapshot FROM jobs")]
    assert snap["created_at"] == 1_700_000_000.0  # the record holds wall time

    # the controller is down 100 s; the new process's monotonic clock starts elsewhere
    restarted = ControllerCore(MachineConfig(join_timeout=600), Store(state), SignalHub(), clock=ManualClock(7.0),
                               wall=ManualClock(1_700_000_100.0))
    restarted.load()
    m = restarted.jobs["j"]
    assert m.created_at == -93.0 and m.join_deadline == 507.0  # 100 s of the 600 s are gone, on the new clock
    restarted.store.close()

    # a wall clock stepped back while the controller was down: stamps do not lie ahead, deadlines keep at most
    # their whole timeout
    stepped = ControllerCore(MachineConfig(join_timeout=600), Store(state), SignalHub(), clock=ManualClock(7.0),
                             wall=ManualClock(1_700_000_000.0 - 3600))
    stepped.load()
    assert stepped.jobs["j"].created_at == 7.0 and stepped.jobs["j"].join_deadline == 607.0
    stepped.store.close()


def finished_job(exit_code: int = 0) -> JobMachine:
    m = JobMachine("j", MachineConfig(), 0.0, JobInit(node_count=2, ranks_per_node=1))
    for n in range(2):
        m.handle(AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=1), 0.0)
        m.handle(AgentConnected(node_rank=n), 0.0)
    m.handle(AgentFinished(node_rank=0, exit_code=0), 1.0)
    m.handle(AgentFinished(node_rank=1, exit_code=exit_code, message="boom" if exit_code else ""), 1.0)
    return m


def test_a_late_re_init_from_an_agent_that_finished_never_resets_the_finished_job() -> None:
    for exit_code, state in ((0, S.SUCCEEDED), (3, S.FAILED)):
        m = finished_job(exit_code)
        assert m.state == state
        out = m.handle(JobInit(node_count=2, ranks_per_node=1, node_rank=1, host="h", pid=101), 1.001)
        assert out.code == 0 and "joined" in out.info, out.info
        assert m.state == state and len(m.agents) == 2 and "job_reset" not in [r.kind for r in out.records]
        # a new run (another process) still starts over
        assert "reset" in m.handle(JobInit(node_count=2, host="h", pid=999), 2.0).info and m.state == S.RUNNING


def test_change_strategy_carries_generation_and_restarts_as_typed_fields() -> None:
    m = JobMachine("job-with-dashes-7", MachineConfig(), 0.0, JobInit(node_count=1, ranks_per_node=2))
    m.handle(AgentRegistered(node_rank=0, host="h", pid=1, ranks_per_node=2), 0.0)
    m.handle(AgentConnected(node_rank=0), 0.0)
    m.handle(FaultReported(faults={1: "1"}), 1.0)
    m.handle(StopComplete(), 1.0)
    out = m.handle(StrategiesReported(strategies=("recover", "job-rescheduling")), 1.0)
    (sig,) = out.signals
    assert sig.signal_type == SignalType.CHANGE_STRATEGY and sig.strategy == "recover"
    assert sig.generation == m.signal_seq and sig.restarts == 1 == m.restarts
    params = json.loads(extra_params(sig))
    assert params == {"generation": sig.generation, "restarts": 1, "round": 1} and sig.round == m.round_number
    # built from the fields, not parsed from the uuid
    odd = Signal(uuid="not-a-number", signal_type=SignalType.CHANGE_STRATEGY, actions=(), generation=12, restarts=2,
                 round=3)
    assert json.loads(extra_params(odd)) == {"generation": 12, "restarts": 2, "round": 3}


def test_the_clock_rule() -> None:
    c = Clock(monotonic=ManualClock(10.0), wall=ManualClock(1000.0))
    assert c.to_wall(4.0) == 994.0 and c.from_wall(994.0) == 4.0
    assert c.from_wall(2000.0) == 10.0  # a stamp "in the future" (a wall clock stepped back) is now
