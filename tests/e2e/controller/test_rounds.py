"""The controller over real gRPC on loopback: whole recovery rounds driven by scripted agents."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.vocabulary import Code

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]
_ids = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2, stop_timeout=60,
                           strategy_timeout=60, recover_timeout=60, settle_window=30)
    with EmbeddedController(cfg) as ctl:
        yield ctl.address


@pytest.fixture(scope="module")
def fast_server() -> Iterator[str]:
    """Short waits, to exercise the timeouts (the stop wait leaves a loaded machine time for one answer)."""
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2, stop_timeout=2.0,
                           strategy_timeout=10, recover_timeout=0.5, settle_window=30)
    with EmbeddedController(cfg) as ctl:
        yield ctl.address


def make_job(address: str, nodes: int = 2, **init: object) -> list[ScriptedAgent]:
    job = f"job-{next(_ids)}"
    agents = [ScriptedAgent(address, job, node_rank=n, node_count=nodes, ranks_per_node=2) for n in range(nodes)]
    for a in agents:
        a.join(**init)
    return agents


@pytest.fixture
def agents_factory() -> Iterator:
    made: list[ScriptedAgent] = []

    def make(address: str, nodes: int = 2, **init: object) -> list[ScriptedAgent]:
        agents = make_job(address, nodes, **init)
        made.extend(agents)
        return agents

    yield make
    for a in made:
        a.close()


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


def stop_and_collect(agents: list[ScriptedAgent], supported: list[str], faults: dict[int, int]) -> None:
    for a in agents:
        sig = a.expect("stopTrain")
        assert sig.actions == ["stop_train"]
        assert {(int(f.rankId), f.faultType) for f in sig.faultRanks} == {(r, str(t)) for r, t in faults.items()}
    for a in agents:
        ok(a.stop_complete(faults=faults))
    for a in agents:
        sig = a.expect("globalFault")
        assert sig.actions == ["on_global_rank"]
    for a in agents:
        ok(a.strategies(supported, faults=faults))


def job_record(agent: ScriptedAgent):  # noqa: ANN201
    jobs = agent.list_jobs(agent.job_id)
    assert jobs.status.code == 0
    return jobs.jobs[0]


@pytest.mark.parametrize("faults,supported,chosen", [
    ({3: 0}, ALL, "retry"),
    ({3: 1}, ALL, "recover"),
    ({3: 2}, ALL, "job-rescheduling"),
], ids=["retry", "recover", "job-rescheduling"])
def test_round_recovers(server: str, agents_factory, faults: dict[int, int], supported: list[str],
                        chosen: str) -> None:
    agents = agents_factory(server)
    ok(agents[1].fault(faults, detail="rank 3 pid 123 killed by SIGKILL"))  # node 1 has ranks 2-3
    stop_and_collect(agents, supported, faults)
    for a in agents:
        sig = a.expect("changeStrategy", chosen)
        assert sig.actions == ["change_strategy"] and sig.timeout == 60
    for a in agents:
        ok(a.status(chosen))
    job = job_record(agents[0])
    assert job.state == "RUNNING"
    (rnd,) = job.rounds
    assert rnd.outcome == "recovered" and rnd.strategy == chosen and rnd.durationSeconds > 0
    assert job.restarts == (1 if chosen in ("recover", "job-rescheduling") else 0)


def test_round_dump_ends_the_job(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({0: 1}))
    stop_and_collect(agents, ["dump", "exit"], {0: 1})
    for a in agents:
        a.expect("changeStrategy", "dump")
    for a in agents:
        ok(a.status("dump"))
    job = job_record(agents[0])
    assert job.state == "FAILED" and "dumped" in job.info
    assert job.rounds[0].outcome == "dumped"


def test_round_exit_ends_the_job(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({0: 1}))
    stop_and_collect(agents, ["exit"], {0: 1})
    for a in agents:
        a.expect("changeStrategy", "exit")
    for a in agents:
        ok(a.status("exit"))  # confirming the exit is still accepted
    job = job_record(agents[0])
    assert job.state == "FAILED" and job.rounds[0].outcome == "failed"
    assert agents[0].fault({1: 1}).code == Code.OUT_OF_ORDER


def test_failed_strategy_escalates(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[1].fault({3: 1}))
    stop_and_collect(agents, ["recover", "job-rescheduling", "exit"], {3: 1})
    for a in agents:
        a.expect("changeStrategy", "recover")
    ok(agents[0].status("recover"))
    ok(agents[1].status("recover", code=1, info="rank 3 did not come back"))
    for a in agents:
        a.expect("changeStrategy", "job-rescheduling")
    late = agents[0].status("recover")
    assert late.code == Code.OUT_OF_ORDER and "job-rescheduling" in late.info
    for a in agents:
        ok(a.status("job-rescheduling"))
    job = job_record(agents[0])
    assert job.state == "RUNNING" and list(job.rounds[0].strategiesTried) == ["recover", "job-rescheduling"]
    assert job.restarts == 1  # a failed recover escalated in its round: one restart in all


def test_timeouts_escalate(fast_server: str, agents_factory) -> None:
    agents = agents_factory(fast_server)
    ok(agents[0].fault({0: 0}))
    for a in agents:
        a.expect("stopTrain")
    ok(agents[0].stop_complete())  # node 1 stays silent: the stop wait times out
    agents[0].expect("globalFault")
    ok(agents[0].strategies(ALL))  # only node 0 is waited for now; retry/recover are excluded
    agents[0].expect("changeStrategy", "job-rescheduling")
    # nobody reports: the recover wait times out, then dump, then exit
    agents[0].expect("changeStrategy", "dump")
    agents[0].expect("changeStrategy", "exit")
    job = job_record(agents[0])
    assert job.state == "FAILED"
    kinds = [e.kind for e in job.events]
    assert "stop_timeout" in kinds and kinds.count("recover_timeout") == 2


def test_fault_before_decision_joins_the_round(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({0: 1}))
    for a in agents:
        a.expect("stopTrain")
    ok(agents[0].stop_complete(faults={0: 1}))
    ok(agents[1].fault({2: 1}))  # joins: stopTrain again with both ranks
    for a in agents:
        sig = a.expect("stopTrain")
        assert sorted(f.rankId for f in sig.faultRanks) == ["0", "2"]
    stale = agents[0].stop_complete(faults={0: 1})  # the first stopTrain's answer, arriving late
    assert stale.code == 0
    ok(agents[1].stop_complete(faults={0: 1, 2: 1}))
    agents[0].no_signal()  # still waiting for node 0's answer to the merged set
    ok(agents[0].stop_complete(faults={0: 1, 2: 1}))
    for a in agents:
        a.expect("globalFault")
    job = job_record(agents[0])
    assert len(job.rounds) == 1 and len(job.rounds[0].faultRanks) == 2


def test_fault_after_decision_opens_the_next_round(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({0: 2}))
    stop_and_collect(agents, ALL, {0: 2})
    for a in agents:
        a.expect("changeStrategy", "job-rescheduling")
    ok(agents[1].status("job-rescheduling"))  # node 1 restarted its ranks: a fault it reports now is a new one
    queued = agents[1].fault({3: 1})
    assert queued.code == 0 and "queued" in queued.info
    agents[1].no_signal()
    ok(agents[0].status("job-rescheduling"))
    for a in agents:  # round 2 starts at once with the queued fault
        sig = a.expect("stopTrain")
        assert [f.rankId for f in sig.faultRanks] == ["3"]
    job = job_record(agents[0])
    assert [r.outcome for r in job.rounds] == ["recovered", "open"] and job.state == "STOPPING"


def test_a_fault_queued_before_a_job_rescheduling_joins_its_round(server: str, agents_factory) -> None:
    """Ranks 3 and 1 die within a second: rank 1's report comes while the recover of rank 3 runs (queued), that
    recover fails, and job-rescheduling restarts every rank. Rank 1's fault joins that round: no second round
    recovers the restarted rank 1 (in a live job it waited out the 120 s rejoin timeout)."""
    agents = agents_factory(server)
    ok(agents[1].fault({3: 1}))
    stop_and_collect(agents, ALL, {3: 1})
    for a in agents:
        a.expect("changeStrategy", "recover")
    queued = agents[0].fault({1: 1})
    assert queued.code == 0 and "queued" in queued.info
    ok(agents[1].status("recover", code=1, info="rank(s) [1] ended before the group re-formed"))
    for a in agents:
        sig = a.expect("changeStrategy", "job-rescheduling")
        assert sorted(f.rankId for f in sig.faultRanks) == ["1", "3"]
    for a in agents:
        ok(a.status("job-rescheduling"))
    for a in agents:
        a.no_signal()  # no round 2
    job = job_record(agents[0])
    assert job.state == "RUNNING" and [r.outcome for r in job.rounds] == ["recovered"] and job.restarts == 1


def test_a_fault_reported_before_the_nodes_job_rescheduling_status_joins_its_round(server: str,
                                                                                  agents_factory) -> None:
    """A node's reports come in order: rank 3's fault, reported by node 1 after the job-rescheduling was chosen but
    before node 1's status, is of a process that job-rescheduling restarts (node 1 saw it die before it carried the
    order out). It joins the round; no second round recovers the restarted rank."""
    agents = agents_factory(server)
    ok(agents[0].fault({0: 2}))
    stop_and_collect(agents, ALL, {0: 2})
    for a in agents:
        a.expect("changeStrategy", "job-rescheduling")
    joined = agents[1].fault({3: 1})
    assert joined.code == 0 and "joined round" in joined.info
    for a in agents:
        ok(a.status("job-rescheduling"))
    for a in agents:
        a.no_signal()
    job = job_record(agents[0])
    assert job.state == "RUNNING" and [r.outcome for r in job.rounds] == ["recovered"]
    assert sorted(f.rankId for f in job.rounds[0].faultRanks) == ["0", "3"]


def test_repeated_reports_are_idempotent(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    for _ in range(3):
        ok(agents[1].fault({3: 1}))
    for a in agents:
        a.expect("stopTrain")
    agents[0].no_signal()  # one stopTrain only
    for _ in range(2):
        for a in agents:
            ok(a.stop_complete())
    for a in agents:
        a.expect("globalFault")
    agents[0].no_signal()
    job = job_record(agents[0])
    assert len(job.rounds) == 1


def test_two_jobs_are_isolated(server: str, agents_factory) -> None:
    job_a = agents_factory(server)
    job_b = agents_factory(server)
    ok(job_a[0].fault({0: 1}))
    for a in job_a:
        a.expect("stopTrain")
    for b in job_b:
        b.no_signal()
    assert job_record(job_b[0]).state == "RUNNING"
    assert job_b[0].stop_complete().code == Code.OUT_OF_ORDER
    keepalive = job_b[0].next_signal(keepalive=True)
    assert keepalive.signalType == "keep-alive" and keepalive.jobId == job_b[0].job_id


def test_settle_window_turns_second_fault_into_job_rescheduling(server: str, agents_factory) -> None:
    agents = agents_factory(server, nodes=1)
    (a,) = agents
    for expected in ("recover", "job-rescheduling"):
        ok(a.fault({0: 1}))
        stop_and_collect(agents, ALL, {0: 1})
        a.expect("changeStrategy", expected)
        ok(a.status(expected))
    kinds = [e.kind for e in job_record(a).events]
    assert "recover_unsettled" in kinds


@pytest.mark.parametrize("rejoined,second", [(False, "job-rescheduling"), (True, "recover")],
                         ids=["tightly-coupled-restart", "live-rebuild"])
def test_a_survivor_failing_right_after_a_recover(server: str, agents_factory, rejoined: bool, second: str) -> None:
    """Rank 1 (node 0) is recovered; survivor rank 3 (node 1) fails right after every agent reported it done.
    Restarted without re-forming the group (MindSpore under msrun): that recover failed, the round starts at
    job-rescheduling, one restart in all. Re-formed (live recovery): a new fault, recovered in place again."""
    agents = agents_factory(server)
    ok(agents[0].fault({1: 1}))
    stop_and_collect(agents, ALL, {1: 1})
    for a in agents:
        a.expect("changeStrategy", "recover")
    for a in agents:
        ok(a.status("recover", rejoined=rejoined))
    ok(agents[1].fault({3: 1}))  # at once (the MindSpore survivor: 0.4 s later)
    stop_and_collect(agents, ALL, {3: 1})
    for a in agents:
        a.expect("changeStrategy", second)
    for a in agents:
        ok(a.status(second, rejoined=rejoined))
    job = job_record(agents[0])
    events = {e.kind: json.loads(e.detail) for e in job.events}
    assert job.restarts == (1 if second == "job-rescheduling" else 2), "an unsettled recover pays for its round"
    assert [r.strategy for r in job.rounds] == ["recover", second]
    if rejoined:
        assert "recover_unsettled" not in events
    else:
        assert events["recover_unsettled"]["restarted_rank"] is False
        assert events["recover_unsettled"]["rejoined"] is False
        assert 0 <= events["recover_unsettled"]["seconds_since"] < 30


def test_policy_and_budget_from_init(server: str, agents_factory) -> None:
    agents = agents_factory(server, nodes=1, max_restarts=1, strategies=["recover", "exit"])
    (a,) = agents
    ok(a.fault({0: 1}))
    stop_and_collect(agents, ALL, {0: 1})
    a.expect("changeStrategy", "recover")
    ok(a.status("recover", code=1))
    a.expect("changeStrategy", "exit")  # policy forbids job-rescheduling; budget is spent anyway
    job = job_record(a)
    assert job.state == "FAILED" and job.maxRestarts == 1 and job.restarts == 1


def test_finished_agents_end_the_job(server: str, agents_factory) -> None:
    good = agents_factory(server)
    ok(good[0].finished(0))
    assert job_record(good[0]).state == "RUNNING"
    ok(good[1].finished(0))
    assert job_record(good[0]).state == "SUCCEEDED"
    bad = agents_factory(server)
    ok(bad[1].finished(2, "rank 3 exited 2"))
    bad[0].expect("changeStrategy", "exit")  # the other agent is told to stop
    assert job_record(bad[0]).state == "FAILED"


def test_init_rejoins_and_resets(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({0: 1}))
    again = agents[1].init()
    assert again.code == 0 and "joined" in again.info  # agents are connected: no reset mid-round
    assert job_record(agents[0]).state == "STOPPING"
    for a in agents:
        ok(a.finished(1))
    # the job's own agent re-Initing after its finish joins (issue 17: it never resets the finished job) ...
    assert "joined" in agents[0].init().info and job_record(agents[0]).state == "FAILED"
    # ... a new run (another process) resets it
    newcomer = ScriptedAgent(server, agents[0].job_id, node_rank=0, node_count=2, ranks_per_node=2, pid=55_555)
    reset = newcomer.init()
    newcomer.close()
    assert reset.code == 0 and "reset" in reset.info
    assert job_record(agents[0]).state == "RUNNING"
    assert agents[0].health().code == Code.NOT_REGISTERED  # a reset forgets the agents
    ok(agents[0].register())
    ok(agents[0].health())


def test_reconnecting_agent_gets_the_signal_it_owes_and_replaces_its_stream(server: str, agents_factory) -> None:
    agents = agents_factory(server)
    ok(agents[0].fault({1: 1}))
    for a in agents:
        a.expect("stopTrain")
    ok(agents[0].stop_complete())
    agents[1].subscribe()  # a new stream (the old one is closed by the controller)
    agents[1].expect("stopTrain")
    ok(agents[1].stop_complete())
    for a in agents:
        a.expect("globalFault")
    job = job_record(agents[0])
    assert all(ag.subscribed for ag in job.agents)


def test_many_subscribers_get_a_broadcast(server: str, agents_factory) -> None:
    agents = agents_factory(server, nodes=40)
    ok(agents[7].fault({15: 1}))
    for a in agents:
        a.expect("stopTrain")
