"""The pure rule behind tests/e2e/controller/test_finished_node_round.py: a node that finishes 0 while an
undecided round awaits another node's rank ends the job (issue 21, D3 across nodes)."""

from __future__ import annotations

import pytest

from taskd.controller.machine.model import JobState, MachineConfig
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentFinished,
    AgentRegistered,
    FaultReported,
    JobInit,
    JobMachine,
    StopComplete,
)

S = JobState


def job(ranks_per_node: int = 2) -> JobMachine:
    m = JobMachine("j", MachineConfig(), 0.0, JobInit(node_count=2, ranks_per_node=ranks_per_node))
    for n in range(2):
        assert m.handle(AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=ranks_per_node), 0).code == 0
        m.handle(AgentConnected(node_rank=n), 0.0)
    assert m.handle(FaultReported(node_rank=1, faults={3: "1"}, host="h", pid=101), 1.0).code == 0
    return m


@pytest.mark.parametrize("collecting", [False, True])
def test_another_node_finishing_before_the_decision_fails_the_job(collecting: bool) -> None:
    m = job()
    if collecting:
        for n in range(2):
            m.handle(StopComplete(node_rank=n, faults={3: "1"}, host="h", pid=100 + n), 2.0)
        assert m.state == S.COLLECTING
    out = m.handle(AgentFinished(node_rank=0, host="h", pid=100), 3.0)
    assert m.state == S.FAILED
    assert m.info == "node(s) 0 finished while round 1 was open for rank(s) 3: no recovery without them"
    [sig] = [s for s in out.signals if s.signal_type == "changeStrategy"]
    assert sig.strategy == "exit" and sig.reason == m.info


def test_the_faulty_node_finishing_or_an_unknown_layout_leaves_the_round_alone() -> None:
    m = job()
    m.handle(AgentFinished(node_rank=1, host="h", pid=101), 3.0)
    assert m.state == S.STOPPING
    m = job(ranks_per_node=0)  # a ClusterD-wire agent says no ranksPerNode: which node holds rank 3 is unknown
    m.handle(AgentFinished(node_rank=0, host="h", pid=100), 3.0)
    assert m.state == S.STOPPING
