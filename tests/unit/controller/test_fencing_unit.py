"""Issue 31, F1: a fenced identity is refused for ever, in every job state, a finished job's included.

Node 1's agent (h:101) is declared lost and replaced by h2:201; the job is then driven into each of its states
and everything the old identity can send is answered 411 naming the holder, and changes nothing: no reset by
its Init, no Register taking the node back, no finish. The fences are stored and come back, re-based, from a
restart (the controller's core with a real SQLite state file).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ManualClock
from support.controller import ROUND_CFG, fire, running_job

from taskd.controller.core import ControllerCore
from taskd.controller.machine.events import PaceReported, TrainingResumed
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    Event,
    FaultReported,
    JobInit,
    JobMachine,
    JobState,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.nodes.node_loss import fence_refusal
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.store import Store
from taskd.vocabulary import Code

S = JobState
OLD = {"node_rank": 1, "host": "h", "pid": 101}  # the lost agent's identity
HELD = "is now held by h2:201"  # what every refusal names


def fenced_events() -> list[Event]:
    """Everything an agent process can send as node 1, from the fenced identity."""
    return [JobInit(node_count=2, ranks_per_node=2, **OLD), AgentRegistered(ranks_per_node=2, **OLD),
            AgentConnected(**OLD), FaultReported(faults={2: "1"}, **OLD), StopComplete(faults={2: "1"}, **OLD),
            StrategiesReported(strategies=("recover", "exit"), **OLD),
            RecoverStatusReported(strategy="recover", **OLD), AgentFinished(exit_code=0, **OLD),
            AgentFinished(exit_code=1, message="fenced", **OLD), PaceReported(factor=2.0, **OLD),
            TrainingResumed(round=1, **OLD)]


def awaiting_replacement() -> JobMachine:
    """Node 1's agent (h:101) lost at t=10, fenced; node 0 stopped and offered recover: REJOINING."""
    m = running_job(per_node=2)
    m.handle(AgentDisconnected(node_rank=1), 5.0)
    fire(m, 10.0)
    assert m.state == S.STOPPING and (1, "h", 101) in m.fences
    m.handle(StopComplete(node_rank=0, host="h", pid=100, faults={2: "1", 3: "1"}), 11.0)
    m.handle(StrategiesReported(node_rank=0, strategies=("recover", "exit"), host="h", pid=100), 12.0)
    assert m.state == S.REJOINING
    return m


def replaced() -> JobMachine:
    """Node 1 lost at t=10 and replaced by h2:201, the round recovered: RUNNING."""
    m = awaiting_replacement()
    assert m.handle(AgentRegistered(node_rank=1, host="h2", pid=201, ranks_per_node=2), 13.0).code == 0
    m.handle(AgentConnected(node_rank=1, host="h2", pid=201), 13.0)
    assert m.state == S.RECOVERING
    for n, (host, pid) in ((0, ("h", 100)), (1, ("h2", 201))):
        m.handle(RecoverStatusReported(node_rank=n, host=host, pid=pid, strategy="recover"), 14.0)
    assert m.state == S.RUNNING
    return m


def _fault(m: JobMachine) -> JobMachine:
    m.handle(FaultReported(node_rank=0, faults={0: "1"}, host="h", pid=100), 20.0)
    return m


def _stopped(m: JobMachine) -> JobMachine:
    _fault(m)
    for n, (host, pid) in ((0, ("h", 100)), (1, ("h2", 201))):
        m.handle(StopComplete(node_rank=n, host=host, pid=pid, faults={0: "1"}), 21.0)
    return m


def _recovering(m: JobMachine) -> JobMachine:
    _stopped(m)
    for n, (host, pid) in ((0, ("h", 100)), (1, ("h2", 201))):
        m.handle(StrategiesReported(node_rank=n, strategies=("job-rescheduling", "exit"), host=host, pid=pid), 22.0)
    return m


def _restored(m: JobMachine) -> JobMachine:
    r, _ = JobMachine.restore(_fault(m).snapshot(), list(m.agents.values()), ROUND_CFG, 30.0)
    return r


def _finished(code: int) -> Callable[[JobMachine], JobMachine]:
    def finish(m: JobMachine) -> JobMachine:
        m.handle(AgentFinished(node_rank=0, exit_code=0, host="h", pid=100), 40.0)
        m.handle(AgentFinished(node_rank=1, exit_code=code, host="h2", pid=201, message="boom" if code else ""), 41.0)
        return m
    return finish


def _gone(code: int) -> Callable[[JobMachine], JobMachine]:
    """Finished, and every stream closed since (the agents exited)."""
    def gone(m: JobMachine) -> JobMachine:
        _finished(code)(m)
        for n in range(2):
            m.handle(AgentDisconnected(node_rank=n), 42.0)
        return m
    return gone


STATES: dict[S, Callable[[JobMachine], JobMachine]] = {
    S.RUNNING: lambda m: m, S.STOPPING: _fault, S.COLLECTING: _stopped, S.RECOVERING: _recovering,
    S.RESUMING: _restored, S.SUCCEEDED: _finished(0), S.FAILED: _finished(1),
}


@pytest.mark.parametrize("state", list(STATES), ids=lambda s: s.value)
def test_a_fenced_identity_is_refused_in_every_job_state_naming_the_holder(state: S) -> None:
    m = STATES[state](replaced())
    assert m.state == state
    before = json.dumps(m.snapshot(), sort_keys=True)
    for ev in fenced_events():
        out = m.handle(ev, 50.0)
        assert out.code == Code.FENCED, (type(ev).__name__, out.code, out.info)
        assert HELD in out.info and "declared lost 40s ago (its agent h:101" in out.info, out.info
        assert out.signals == [] and out.records == [] and out.direct == [], type(ev).__name__
    assert json.dumps(m.snapshot(), sort_keys=True) == before  # nothing changed, the holder included
    assert (m.agents[1].host, m.agents[1].pid) == ("h2", 201) and m.state == state


def test_a_fenced_identity_is_refused_while_its_node_awaits_a_replacement() -> None:
    m = awaiting_replacement()
    for ev in fenced_events():
        out = m.handle(ev, 13.0)
        assert out.code == Code.FENCED and "awaits a replacement" in out.info, (type(ev).__name__, out.info)
    assert m.state == S.REJOINING and m.rejoining == {1: 10.0}


@pytest.mark.parametrize("end", [_finished(0), _gone(0), _finished(1), _gone(1)],
                         ids=["succeeded", "succeeded-all-gone", "failed", "failed-all-gone"])
def test_init_from_a_fenced_identity_never_resets_a_finished_job(end: Callable[[JobMachine], JobMachine]) -> None:
    """The probe's F1: with the replacement's stream open, the fenced agent's Init answered "job j reset (job was
    SUCCEEDED)" and wiped the record. Refused instead, whether or not any stream is open; a new run still resets."""
    m = end(replaced())
    state, history = m.state, json.dumps(m.snapshot(), sort_keys=True)
    out = m.handle(JobInit(node_count=2, ranks_per_node=2, **OLD), 60.0)
    assert out.code == Code.FENCED and HELD in out.info and "reset" not in out.info, out.info
    assert m.state == state and json.dumps(m.snapshot(), sort_keys=True) == history
    fresh = m.handle(JobInit(node_count=2, ranks_per_node=2, node_rank=0, host="h3", pid=300), 61.0)
    assert fresh.code == 0 and "reset" in fresh.info and m.state == S.RUNNING  # an operator's new run


def test_fences_are_stored_and_a_restarted_controller_refuses_the_fenced_stream_of_a_finished_job(
        tmp_path: Path) -> None:
    """Through the core: the `taskd.fenced` answer to a Subscribe, Init and Register refused, from the state file
    after a restart, with the fence's time re-based to the new clock."""
    state = tmp_path / "ctl.sqlite3"
    mono, wall = ManualClock(1000.0), ManualClock(1_700_000_000.0)
    core = ControllerCore(ROUND_CFG, Store(state), SignalHub(), clock=mono, wall=wall)
    m = replaced()
    core.jobs["j"] = m  # the machine, driven above, handed to the core to store: its next event commits it all
    assert core.dispatch("j", AgentFinished(node_rank=0, exit_code=0, host="h", pid=100)).code == 0
    assert core.dispatch("j", AgentFinished(node_rank=1, exit_code=0, host="h2", pid=201)).code == 0
    assert core.jobs["j"].state == S.SUCCEEDED
    core.group.flush()
    core.store.close()
    wall.now += 100.0  # down 100 s; the new process's monotonic clock starts elsewhere
    restarted = ControllerCore(ROUND_CFG, Store(state), SignalHub(), clock=ManualClock(7.0), wall=wall)
    assert restarted.load() == 1
    r = restarted.jobs["j"]
    assert r.state == S.SUCCEEDED and (1, "h", 101) in r.fences
    assert r.fences[(1, "h", 101)].by_pid == 201
    assert restarted.fenced("j", 1, "h", 101) is not None and restarted.fenced("j", 1, "h2", 201) is None
    info = fence_refusal(r, AgentConnected(**OLD), restarted.clock())
    assert HELD in info and "this agent must stop its ranks and exit" in info, info
    out = restarted.init_job("j", JobInit(node_count=2, ranks_per_node=2, **OLD))
    assert out.code == Code.FENCED and r.state == S.SUCCEEDED, out.info
    assert restarted.dispatch("j", AgentRegistered(ranks_per_node=2, **OLD)).code == Code.FENCED
    assert (r.agents[1].host, r.agents[1].pid) == ("h2", 201)
    restarted.store.close()
