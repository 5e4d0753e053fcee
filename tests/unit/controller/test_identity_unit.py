"""The tests of tests/e2e/controller/test_identity.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: Each node has one agent (issue 11, item 4): a live
agent is not replaced by another (host, pid).
"""

from __future__ import annotations

from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentLossDue,
    AgentRegistered,
    JobInit,
    JobMachine,
    MachineConfig,
)
from taskd.vocabulary import Code


def test_holder_rule_over_time() -> None:
    m = JobMachine("j", MachineConfig(agent_loss_timeout=30), 0.0, JobInit(node_count=1))
    assert m.handle(AgentRegistered(node_rank=0, host="a", pid=1), 0.0).code == 0
    refused = m.handle(AgentRegistered(node_rank=0, host="b", pid=2), 29.0)
    assert refused.code == Code.INVALID_PARAMS and not refused.records and not refused.agents_changed
    assert (m.agents[0].host, m.agents[0].pid) == ("a", 1)  # not replaced
    m.handle(AgentLossDue(), 30.0)  # declared lost (a job without ranksPerNode fails then)
    assert m.handle(AgentRegistered(node_rank=0, host="b", pid=2), 30.0).code == 0  # taken over
    m.handle(AgentConnected(node_rank=0), 31.0)
    assert m.holder(0, "c", 3, 10_000.0) is m.agents[0]  # a stream open is live however long it has been
    assert m.holder(0, "b", 2, 31.0) is None  # itself
    m.handle(AgentDisconnected(node_rank=0), 32.0)
    assert m.holder(0, "c", 3, 32.0) is None  # its stream closed: whoever registers next takes over
