"""The tests of tests/e2e/agent/test_join_timeout.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: A multi-node job waits for all its nodes, bounded by a
join timeout (torchrun's rendezvous join_timeout).
"""

from __future__ import annotations

import pytest

from taskd.agent.link.job_status import format_nodes
from taskd.controller.cli_commands import add_server_arguments, server_config
from taskd.controller.config import ConfigError
from taskd.controller.machine.events import AgentConnected, AgentFinished, AgentRegistered, JobInit, JoinDue
from taskd.controller.machine.model import JobState, MachineConfig
from taskd.controller.machine.state_machine import JobMachine

S = JobState


CFG = MachineConfig(join_timeout=600)


def register(m: JobMachine, node: int, t: float) -> None:
    assert m.handle(AgentRegistered(node_rank=node, host="h", pid=100 + node), t).code == 0
    m.handle(AgentConnected(node_rank=node), t)


def fire(m: JobMachine, t: float) -> list:
    outs = [m.handle(ev, t) for ev in m.due_events(t)]
    return [s for o in outs for s in o.signals]


def test_missing_node_fails_the_job_join_timeout_after_the_first_registration() -> None:
    m = JobMachine("lone", CFG, 0.0, JobInit(node_count=2))
    assert m.wake_at is None  # nobody registered: nothing to time
    register(m, 1, 5.0)
    assert m.wake_at == 605.0
    assert m.due_events(604.9) == [] and m.state == S.RUNNING
    signals = fire(m, 605.0)
    assert m.state == S.FAILED
    assert m.info == "node(s) [0] never joined within 600 s"
    assert [(s.signal_type, s.strategy) for s in signals] == [("changeStrategy", "exit")]  # node 1 is told to exit
    assert m.wake_at is None


def test_every_node_joining_in_time_stops_the_clock_and_a_stale_timer_changes_nothing() -> None:
    m = JobMachine("j", CFG, 0.0, JobInit(node_count=3))
    register(m, 2, 1.0)
    register(m, 0, 100.0)
    assert m.wake_at == 601.0  # from the first registration, not the latest
    register(m, 1, 600.0)
    assert m.wake_at is None and m.due_events(10_000) == []
    out = m.handle(JoinDue(), 700.0)  # a timer set before the last node came
    assert out.code == 0 and out.signals == [] and m.state == S.RUNNING


def test_nobody_left_to_tell_and_many_missing_nodes_are_counted() -> None:
    m = JobMachine("big", CFG, 0.0, JobInit(node_count=30))
    register(m, 29, 0.0)
    m.handle(AgentFinished(node_rank=29, exit_code=0), 1.0)
    signals = fire(m, 600.0)
    assert m.state == S.FAILED and signals == []  # its only agent already finished
    first = ", ".join(map(str, range(20)))
    assert m.info == f"node(s) [{first}, ...] (29 of 30) never joined within 600 s"
    assert format_nodes(list(range(29))) == f"[{first}, ...] (29 nodes)"  # the agent's lines cut the same way


def test_a_reset_restarts_the_clock_and_a_controller_restart_keeps_it() -> None:
    m = JobMachine("j", CFG, 0.0, JobInit(node_count=2))
    register(m, 1, 10.0)
    fire(m, 610.0)
    assert m.state == S.FAILED
    m.handle(JobInit(node_count=2, host="h", pid=999), 700.0)  # a new run of the job
    assert m.state == S.RUNNING and m.wake_at is None
    register(m, 0, 710.0)
    assert m.wake_at == 1310.0
    restored, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 800.0)
    restored.handle(AgentConnected(node_rank=0), 801.0)
    assert restored.join_deadline == 1310.0  # counted from the stored registration, not the restart
    assert fire(restored, 1310.0) and restored.state == S.FAILED and "[1] never joined" in restored.info


def test_join_timeout_is_a_server_flag_and_a_bad_one_names_it() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert server_config(parser.parse_args([])).join_timeout == 600.0
    assert server_config(parser.parse_args(["--join-timeout", "30"])).join_timeout == 30.0
    with pytest.raises(ConfigError, match=r"--join-timeout must be > 0, got 0.0 \(ControllerConfig.join_timeout\)"):
        server_config(parser.parse_args(["--join-timeout", "0"]))
