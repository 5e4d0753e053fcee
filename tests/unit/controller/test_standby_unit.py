"""Issue 17, standby agents in the controller's pure state machine: registered apart from the nodes, assigned a
lost node longest-waiting first, dropped when they go, bounded, released when the job ends, persisted."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

from support.controller import ROUND_CFG, fire, running_job

from taskd.controller.machine.events import StandbyConnected, StandbyDisconnected
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    JobInit,
    JobMachine,
    JobState,
    RecoverStatusReported,
)
from taskd.controller.service.hub import extra_params
from taskd.controller.storage.checkpoint import Checkpoint
from taskd.vocabulary import Code, SignalType

S = JobState
CFG = replace(ROUND_CFG, max_standbys=2)
job = partial(running_job, cfg=CFG)


def spare(m: JobMachine, pid: int, t: float) -> Any:
    out = m.handle(AgentRegistered(node_rank=0, host="s", pid=pid, standby=True), t)
    if out.code == 0:
        m.handle(StandbyConnected(host="s", pid=pid), t)
    return out


def lose(m: JobMachine, node: int, t: float) -> list[Any]:
    m.handle(AgentDisconnected(node_rank=node), t)
    return fire(m, t + 5)


def assigned(outs: list[Any]) -> list[tuple[tuple[str, int], int]]:
    return [(key, json.loads(extra_params(sig))["node_rank"]) for o in outs for key, sig in o.to_standbys
            if sig is not None and sig.signal_type == SignalType.ASSIGN_NODE]


def test_a_standby_is_no_node_and_the_longest_waiting_takes_the_first_loss_the_next_the_second() -> None:
    m = job(3)
    assert spare(m, 2, 1.0).code == 0 and spare(m, 1, 2.0).code == 0
    assert sorted(m.agents) == [0, 1, 2] and m.node_count == 3 and set(m.standbys) == {("s", 2), ("s", 1)}
    outs = lose(m, 1, 3.0)
    assert m.state == S.STOPPING and assigned(outs) == [(("s", 2), 1)]  # registered first, waited longest
    (sig,) = [sig for o in outs for _, sig in o.to_standbys]
    assert sig.nodes == (1,) and json.loads(extra_params(sig)) == {"node_rank": 1}
    outs = lose(m, 2, 4.0)
    assert assigned(outs) == [(("s", 1), 2)]
    # the first standby's Register as node 1 is the hand-over; its standby stream is closed
    out = m.handle(AgentRegistered(node_rank=1, host="s", pid=2, ranks_per_node=1), 10.0)
    assert out.code == 0 and "replacement of node 1" in out.info
    assert (("s", 2), None) in out.to_standbys and ("s", 2) not in m.standbys
    replaced = [r for r in out.records if r.kind == "node_replaced"]
    assert replaced and replaced[0].detail["standby"] is True
    assert any(f.standby and f.by_pid == 2 for f in m.fences.values())
    # its client re-registers as node 1 before subscribing: not a second hand-over
    again = m.handle(AgentRegistered(node_rank=1, host="s", pid=2, ranks_per_node=1), 10.5)
    assert again.code == 0 and "node_replaced" not in [r.kind for r in again.records]
    # a re-register with its standby identity (sent before the hand-over's answer was back) is refused: the
    # process holds node 1 and is never a spare as well
    stale = m.handle(AgentRegistered(node_rank=0, host="s", pid=2, standby=True), 10.6)
    assert stale.code == Code.INVALID_PARAMS and "holds node 1" in stale.info and ("s", 2) not in m.standbys
    assert not [r for r in stale.records if r.kind == "standby_registered"]


def test_a_standby_that_goes_is_dropped_and_its_node_goes_to_the_next() -> None:
    m = job()
    spare(m, 1, 1.0)
    spare(m, 2, 2.0)
    assert assigned(lose(m, 1, 3.0)) == [(("s", 1), 1)]
    out = m.handle(StandbyDisconnected(host="s", pid=1), 9.0)
    assert ("s", 1) not in m.standbys and "standby_dropped" in [r.kind for r in out.records]
    assert assigned([out]) == [(("s", 2), 1)]
    assert m.state != S.FAILED and m.round is not None and m.round.lost == {1: 3.0}  # no round of its own


def test_a_replacement_registering_before_the_assigned_standby_takes_the_node_and_frees_the_standby() -> None:
    """The lost node's recreated pod (Kubernetes) may register first: it is the replacement, the standby's Register
    as that node is refused as held (its agent waits again), and the standby takes the next node lost."""
    m = job(3)
    spare(m, 1, 1.0)
    assert assigned(lose(m, 1, 2.0)) == [(("s", 1), 1)]
    out = m.handle(AgentRegistered(node_rank=1, host="pod1", pid=50, ranks_per_node=1), 8.0)
    assert out.code == 0 and "replacement of node 1" in out.info
    assert m.standbys[("s", 1)].assigned is None  # free again
    refused = m.handle(AgentRegistered(node_rank=1, host="s", pid=1, ranks_per_node=1), 8.1)
    assert refused.code == Code.INVALID_PARAMS and "is held by a live agent" in refused.info
    assert m.agents[1].pid == 50 and ("s", 1) in m.standbys
    m.handle(AgentConnected(node_rank=1, host="pod1", pid=50), 8.2)
    assert assigned(lose(m, 2, 20.0)) == [(("s", 1), 2)]  # the next loss takes it


def test_a_standby_arriving_after_the_loss_takes_the_node_at_once() -> None:
    m = job()
    lose(m, 1, 1.0)
    m.handle(AgentRegistered(node_rank=0, host="s", pid=9, standby=True), 7.0)
    out = m.handle(StandbyConnected(host="s", pid=9), 7.0)
    assert [s.signal_type for s in out.direct] == [SignalType.ASSIGN_NODE]  # on its own, new stream
    assert m.standbys[("s", 9)].assigned == 1


def test_more_standbys_than_the_bound_are_refused_and_a_known_one_is_not_counted_twice() -> None:
    m = job()
    assert spare(m, 1, 1.0).code == 0 and spare(m, 2, 1.0).code == 0
    assert spare(m, 1, 2.0).code == 0  # the same process again (its client resubscribing)
    out = m.handle(AgentRegistered(node_rank=0, host="s", pid=3, standby=True), 3.0)
    assert out.code == Code.INVALID_PARAMS and "--max-standbys" in out.info and len(m.standbys) == 2


def test_the_jobs_end_releases_every_standby_with_exit() -> None:
    m = job()
    spare(m, 1, 1.0)
    m.handle(AgentFinished(node_rank=0), 2.0)
    out = m.handle(AgentFinished(node_rank=1), 3.0)
    assert m.state == S.SUCCEEDED and m.standbys == {}
    (key, sig), = out.to_standbys
    assert key == ("s", 1) and sig.strategy == "exit" and "job ended" in sig.reason
    # one that comes to an ended job is told at once
    m.handle(AgentRegistered(node_rank=0, host="s", pid=5, standby=True), 4.0)
    late = m.handle(StandbyConnected(host="s", pid=5), 4.0)
    assert [(s.signal_type, s.strategy) for s in late.direct] == [(SignalType.CHANGE_STRATEGY, "exit")]


def test_a_standbys_init_never_resets_and_the_jobs_first_init_keeps_its_standbys() -> None:
    m = JobMachine("j", CFG, 0.0, JobInit(node_count=2, ranks_per_node=1, standby=True, host="s", pid=1))
    spare(m, 1, 0.5)  # the standby came first: the job id is the rendezvous
    assert m.handle(JobInit(node_count=2, standby=True, host="s", pid=1), 0.6).records[0].kind == "job_joined"
    out = m.handle(JobInit(node_count=2, ranks_per_node=1, host="h", pid=100), 1.0)
    assert [r.kind for r in out.records] == ["job_joined"] and set(m.standbys) == {("s", 1)}  # nothing to reset


def test_standbys_survive_a_controller_restart_and_an_undone_event() -> None:
    m = job()
    spare(m, 1, 1.0)
    restored, _ = JobMachine.restore(m.snapshot(), [m.agents[n] for n in m.agents], CFG, 50.0)
    (s,) = restored.standbys.values()
    assert (s.host, s.pid, s.since, s.subscribed) == ("s", 1, 1.0, False)
    restored.handle(StandbyConnected(host="s", pid=1), 51.0)
    assert restored.standbys[("s", 1)].subscribed
    saved = Checkpoint(m, None)
    m.handle(AgentRegistered(node_rank=0, host="s", pid=2, standby=True), 2.0)
    assert saved.restore() and set(m.standbys) == {("s", 1)}


def test_a_standby_that_never_opens_its_stream_is_dropped_after_the_agent_loss_timeout() -> None:
    m = job()
    assert m.handle(AgentRegistered(node_rank=0, host="s", pid=7, standby=True), 1.0).code == 0  # no Subscribe
    assert m.wake_at == 31.0  # registered at 1.0 + agent_loss_timeout 30: the timer is set for it
    assert m.due_events(30.9) == []
    (ev,) = m.due_events(31.0)
    out = m.handle(ev, 31.0)
    assert m.standbys == {} and m.wake_at is None
    (rec,) = [r for r in out.records if r.kind == "standby_dropped"]
    assert rec.detail["pid"] == 7 and "no signal stream for 30s" in rec.detail["reason"]
    # one that subscribed in time has no timer
    spare(m, 8, 40.0)
    assert ("s", 8) in m.standbys and m.wake_at is None and m.due_events(1000.0) == []


def test_a_report_from_another_process_than_the_nodes_registered_agent_is_refused_and_changes_nothing() -> None:
    """A former standby that kept its spare identity reported node 1's finish as node 0's (seen in a loaded
    run of test_node_loss_live[2-standby]): node 0's record must not be the target of another process."""
    m = job()
    out = m.handle(AgentFinished(node_rank=0, exit_code=0, host="h", pid=101), 1.0)  # node 1's process
    assert out.code == Code.INVALID_PARAMS and "held by h:100, not by h:101" in out.info, out.info
    assert not m.agents[0].finished and m.state == S.RUNNING and not out.records
    status = m.handle(RecoverStatusReported(node_rank=0, code=0, strategy="recover", host="s", pid=7), 1.0)
    assert status.code == Code.INVALID_PARAMS
    assert m.handle(AgentFinished(node_rank=0, exit_code=0), 2.0).code == 0  # ClusterD's clients send no pid
    assert m.agents[0].finished
