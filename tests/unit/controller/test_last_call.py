"""`--nnodes MIN:MAX` starts after torchrun's last call and grows when a node arrives (issue 32, item 5), pure.

The job's nodes 0..MIN-1 registered `last_call_timeout` ago: the missing nodes become absent and the job runs
with the others (no join timeout any more); a node absent since the start that subscribes later opens a round
that restarts every rank at the new size (job-rescheduling, in-place strategies excluded), not charged.
"""

from __future__ import annotations

from dataclasses import replace

from taskd.controller.machine.events import LastCallDue
from taskd.controller.machine.job import last_call_deadline
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentRegistered,
    JobInit,
    JobMachine,
    JobState,
    MachineConfig,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.vocabulary import SignalType, Strategy

S = JobState
CFG = replace(MachineConfig(), last_call_timeout=2.0, join_timeout=600.0)
ALL = tuple(Strategy.ORDER)


def elastic(nodes: int = 2, low: int = 1, **init: object) -> JobMachine:
    return JobMachine("j", CFG, 0.0, JobInit(node_count=nodes, ranks_per_node=1, min_nodes=low, max_restarts=0,
                                             **init))


def join(m: JobMachine, n: int, t: float) -> None:
    assert m.handle(AgentRegistered(node_rank=n, host="h", pid=100 + n), t).code == 0
    m.handle(AgentConnected(node_rank=n), t)


def test_the_job_starts_with_the_nodes_present_after_the_last_call() -> None:
    m = elastic()
    join(m, 0, 1.0)
    assert last_call_deadline(m) == 3.0 and m.wake_at == 3.0 and m.due_events(2.9) == []
    due = m.due_events(3.0)
    assert [type(ev) for ev in due] == [LastCallDue]
    fired = [m.handle(ev, 3.0) for ev in due]
    assert m.due_events(3.0) == [] and m.state == S.RUNNING and set(m.absent) == {1}
    assert [r.kind for o in fired for r in o.records] == ["started_smaller"], fired
    assert m.join_deadline is None and last_call_deadline(m) is None  # no join timeout for the absent node
    assert "started with 1 of 2 node(s)" in m.info


def test_a_node_that_arrives_later_grows_the_job_by_an_uncharged_job_rescheduling() -> None:
    m = elastic()
    join(m, 0, 0.0)
    for ev in m.due_events(2.0):
        m.handle(ev, 2.0)
    m.handle(AgentRegistered(node_rank=1, host="h", pid=101), 5.0)
    out = m.handle(AgentConnected(node_rank=1), 5.0)
    assert m.state == S.STOPPING and not m.absent, out
    assert [s.signal_type for s in out.signals] == [SignalType.STOP_TRAIN]
    assert "node_joined_late" in [r.kind for r in out.records]
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n, faults={1: "1"}), 5.1)
    for n in (0, 1):
        out = m.handle(StrategiesReported(node_rank=n, strategies=ALL), 5.2)
    assert out.signals[-1].strategy == Strategy.JOB_RESCHEDULING and m.restarts == 0, out  # budget 0: not charged
    for n in (0, 1):
        m.handle(RecoverStatusReported(node_rank=n, strategy=Strategy.JOB_RESCHEDULING), 6.0)
    assert m.state == S.RUNNING and m.expected_nodes() == {0, 1}


def test_no_last_call_before_min_nodes_or_with_a_gap() -> None:
    m = elastic(nodes=3, low=2)
    join(m, 0, 0.0)
    assert last_call_deadline(m) is None  # MIN is 2
    m = elastic(nodes=3, low=1)
    join(m, 0, 0.0)
    join(m, 2, 0.5)
    assert last_call_deadline(m) is None and m.join_deadline == 600.0  # node 1 missing between: wait for it
    fixed = JobMachine("f", CFG, 0.0, JobInit(node_count=2, ranks_per_node=1))
    join(fixed, 0, 0.0)
    assert last_call_deadline(fixed) is None  # a fixed-size job waits for every node


def test_last_call_due_is_ignored_once_every_node_joined() -> None:
    m = elastic()
    join(m, 0, 0.0)
    join(m, 1, 1.0)
    out = m.handle(LastCallDue(), 5.0)
    assert not m.absent and out.records == [] and m.state == S.RUNNING
