"""The recovery state machine as a table: events in, states, codes and signals out (no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from taskd.controller.machine import handlers, table
from taskd.controller.machine.model import Round
from taskd.controller.machine.state_machine import (
    RULES,
    UNCHANGED,
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    AgentRegistered,
    FaultReported,
    JobInit,
    JobMachine,
    JobState,
    MachineConfig,
    RecoverStatusReported,
    Rule,
    StopComplete,
    StrategiesReported,
    Tick,
    TransitionError,
    choose_strategy,
    describe_table,
)
from taskd.vocabulary import Code, SignalType, Strategy

S = JobState
# agent_loss_grace = the loss timeout: these tests time one loss clock; a job without ranksPerNode (new_job) cannot
# name a lost node's ranks, so a lost agent still fails it (tests/unit/controller/test_node_loss_round.py has the
# node-loss round of a job that says its ranks per node)
CFG = MachineConfig(stop_timeout=10, strategy_timeout=10, recover_timeout=50, resume_timeout=20, settle_window=30,
                    default_max_restarts=3, agent_loss_timeout=30, agent_loss_grace=30)
ALL = ("retry", "recover", "job-rescheduling", "dump", "exit")


@dataclass
class Step:
    """Deliver `event` at time `t`; then check state, code, and the types/strategies of broadcast signals."""

    t: float
    event: Any
    state: JobState
    code: int = 0
    signals: list[str] = field(default_factory=list)  # "stopTrain" / "globalFault" / "changeStrategy:<name>"
    info: str = ""


def new_job(nodes: int = 2, cfg: MachineConfig = CFG, **init: Any) -> JobMachine:
    m = JobMachine("j1", cfg, 0.0, JobInit(node_count=nodes, **init))
    for n in range(nodes):
        assert m.handle(AgentRegistered(node_rank=n, host="h", pid=100 + n), 0.0).code == 0
        m.handle(AgentConnected(node_rank=n), 0.0)
    return m


def sig_names(out) -> list[str]:
    return [s.signal_type + (f":{s.strategy}" if s.strategy else "") for s in out.signals]


def play(m: JobMachine, steps: list[Step]) -> None:
    for i, st in enumerate(steps):
        out = m.handle(st.event, st.t)
        where = f"step {i}: {st.event}"
        assert out.code == st.code, f"{where}: code {out.code} ({out.info})"
        assert m.state == st.state, where
        assert sig_names(out) == st.signals, where
        assert st.info in out.info, f"{where}: info {out.info!r}"


def stop(n: int, t: float = 1, state: S = S.STOPPING, signals: list[str] | None = None) -> Step:
    return Step(t, StopComplete(node_rank=n), state, signals=signals or [])


def round_steps(faults: dict[int, str], supported: tuple[str, ...], chosen: str, end: S = S.RUNNING) -> list[Step]:
    """A whole round on a 2-node job, both agents answering."""
    return [
        Step(1, FaultReported(node_rank=1, faults=faults), S.STOPPING, signals=["stopTrain"]),
        stop(0),
        stop(1, state=S.COLLECTING, signals=["globalFault"]),
        Step(2, StrategiesReported(node_rank=0, strategies=supported), S.COLLECTING),
        Step(2, StrategiesReported(node_rank=1, strategies=supported), S.RECOVERING if chosen != "exit" else S.FAILED,
             signals=[f"changeStrategy:{chosen}"]),
    ] + ([] if chosen == "exit" else [
        Step(3, RecoverStatusReported(node_rank=0, strategy=chosen), S.RECOVERING),
        Step(4, RecoverStatusReported(node_rank=1, strategy=chosen), end),
    ])


FULL_ROUNDS = {
    "retry with type-0 faults": ({1: "0"}, ALL, "retry", S.RUNNING),
    "recover for a process fault": ({1: "1"}, ALL, "recover", S.RUNNING),
    "mixed 0/1 faults skip retry": ({1: "0", 2: "1"}, ALL, "recover", S.RUNNING),
    "network fault starts at job-rescheduling": ({1: "2"}, ALL, "job-rescheduling", S.RUNNING),
    "only what every agent supports": ({1: "0"}, ("job-rescheduling", "exit"), "job-rescheduling", S.RUNNING),
    "dump ends the job": ({1: "1"}, ("dump", "exit"), "dump", S.FAILED),
    "exit ends the job": ({1: "1"}, ("exit",), "exit", S.FAILED),
    "nothing supported means exit": ({1: "1"}, (), "exit", S.FAILED),
}


@pytest.mark.parametrize("faults,supported,chosen,end", FULL_ROUNDS.values(), ids=FULL_ROUNDS.keys())
def test_full_round(faults: dict[int, str], supported: tuple[str, ...], chosen: str, end: S) -> None:
    m = new_job()
    play(m, round_steps(faults, supported, chosen, end))
    if end == S.RUNNING:
        assert m.round is None and m.deadline is None
    if chosen in ("recover", "job-rescheduling"):
        assert m.restarts == 1
    if chosen == "dump":
        assert "dumped" in m.info


def test_recovery_recorded_with_duration() -> None:
    m = new_job()
    records = []
    for st in round_steps({1: "1"}, ALL, "recover"):
        records += m.handle(st.event, st.t).records
    ended = [r for r in records if r.kind == "round_ended"]
    assert len(ended) == 1
    assert ended[0].detail["outcome"] == "recovered" and ended[0].detail["strategy"] == "recover"
    assert ended[0].detail["duration"] == pytest.approx(3.0)  # fault at t=1, last status at t=4


def test_stop_train_goes_to_every_agent_with_all_fault_ranks() -> None:
    m = new_job(nodes=3)
    out = m.handle(FaultReported(node_rank=2, faults={5: "1", 7: "1"}), 1)
    (sig,) = out.signals
    assert sig.signal_type == SignalType.STOP_TRAIN and sig.actions == ("stop_train",)
    assert sig.faults == ((5, "1"), (7, "1"))
    assert m.deadline == 1 + CFG.stop_timeout
    for n in (0, 1):
        assert m.handle(StopComplete(node_rank=n), 2).signals == []
    (g,) = m.handle(StopComplete(node_rank=2), 2).signals
    assert g.signal_type == SignalType.GLOBAL_FAULT and g.actions == ("on_global_rank",) and g.faults == sig.faults


def test_signals_name_the_nodes_of_the_fault_ranks_as_node_rank_ids() -> None:
    from taskd.controller.service.hub import to_message

    m = new_job(nodes=3, ranks_per_node=4)
    (sig,) = m.handle(FaultReported(node_rank=1, faults={5: "1", 9: "1", 6: "1"}), 1).signals
    assert sig.nodes == (1, 2), "ranks 5, 6 live on node 1, rank 9 on node 2"
    assert list(to_message("j1", sig).nodeRankIds) == ["1", "2"]
    unknown = new_job(nodes=2)  # ranks per node never told: no guess
    (sig,) = unknown.handle(FaultReported(node_rank=1, faults={3: "1"}), 1).signals
    assert sig.nodes == () and list(to_message("j1", sig).nodeRankIds) == []


def test_change_strategy_signal_fields() -> None:
    m = new_job(nodes=1)
    m.handle(FaultReported(faults={0: "1"}), 1)
    m.handle(StopComplete(), 1)
    (sig,) = m.handle(StrategiesReported(strategies=ALL), 1).signals
    assert sig.signal_type == "changeStrategy" and sig.actions == ("change_strategy",)
    assert sig.strategy == "recover" and sig.timeout == CFG.recover_timeout


# ------------------------------------------------------------------ escalation


def test_failed_strategy_escalates_to_the_next() -> None:
    m = new_job()
    play(m, round_steps({1: "1"}, ALL, "recover")[:-2] + [
        Step(3, RecoverStatusReported(node_rank=0, code=1, info="spawn failed", strategy="recover"), S.RECOVERING,
             signals=["changeStrategy:job-rescheduling"]),
        Step(3, RecoverStatusReported(node_rank=1, strategy="recover"), S.RECOVERING, code=Code.OUT_OF_ORDER,
             info="carrying out job-rescheduling, not recover"),
        Step(4, RecoverStatusReported(node_rank=0, strategy="job-rescheduling"), S.RECOVERING),
        Step(4, RecoverStatusReported(node_rank=1, strategy="job-rescheduling"), S.RUNNING),
    ])
    assert m.restarts == 1  # the failed recover and the job-rescheduling it escalated to: one restart in all


def test_recover_timeout_escalates_then_exit_after_everything_failed() -> None:
    m = new_job()
    play(m, round_steps({1: "1"}, ("recover", "job-rescheduling", "exit"), "recover")[:-2] + [
        Step(2 + 49, Tick(), S.RECOVERING),  # not yet due
        Step(2 + 50, Tick(), S.RECOVERING, signals=["changeStrategy:job-rescheduling"]),
        Step(200, Tick(), S.FAILED, signals=["changeStrategy:exit"]),
    ])
    assert "exit" in m.info and m.deadline is None


def test_stop_timeout_proceeds_without_the_silent_agent_and_excludes_in_place() -> None:
    m = new_job()
    play(m, [
        Step(1, FaultReported(node_rank=1, faults={1: "0"}), S.STOPPING, signals=["stopTrain"]),
        stop(0),
        Step(11, Tick(), S.COLLECTING, signals=["globalFault"]),
        # only node 0 is waited for now; type-0 would allow retry, but the timeout excludes it
        Step(12, StrategiesReported(node_rank=0, strategies=ALL), S.RECOVERING,
             signals=["changeStrategy:job-rescheduling"]),
        Step(13, RecoverStatusReported(node_rank=0, strategy="job-rescheduling"), S.RUNNING),
    ])


def test_collect_timeout_proceeds_without_the_silent_agent() -> None:
    m = new_job()
    play(m, round_steps({1: "1"}, ALL, "recover")[:4] + [
        Step(12, Tick(), S.RECOVERING, signals=["changeStrategy:job-rescheduling"]),
    ])


def test_stop_failure_excludes_in_place_strategies() -> None:
    m = new_job(nodes=1)
    play(m, [
        Step(1, FaultReported(faults={0: "0"}), S.STOPPING, signals=["stopTrain"]),
        Step(1, StopComplete(code=1, info="rank 0 survived SIGKILL"), S.COLLECTING, signals=["globalFault"]),
        Step(1, StrategiesReported(strategies=ALL), S.RECOVERING, signals=["changeStrategy:job-rescheduling"]),
    ])


def test_no_agent_answers_means_exit() -> None:
    m = new_job()
    play(m, [
        Step(1, FaultReported(faults={0: "1"}), S.STOPPING, signals=["stopTrain"]),
        Step(20, Tick(), S.FAILED, signals=["changeStrategy:exit"]),
    ])


# ------------------------------------------------------------------ faults during a round


def test_fault_before_decision_joins_the_round() -> None:
    m = new_job()
    play(m, [
        Step(1, FaultReported(node_rank=0, faults={0: "0"}), S.STOPPING, signals=["stopTrain"]),
        stop(0),
        Step(2, FaultReported(node_rank=1, faults={3: "1"}), S.STOPPING, signals=["stopTrain"]),
        stop(1),  # node 0's earlier ack was for the smaller set: still waiting for it
        stop(0, state=S.COLLECTING, signals=["globalFault"]),
        Step(3, FaultReported(node_rank=1, faults={4: "1"}), S.STOPPING, signals=["stopTrain"]),  # back to stopping
    ])
    assert m.last_signal is not None and [r for r, _ in m.last_signal.faults] == [0, 3, 4]
    assert m.round is not None and m.round.number == 1


def test_stale_stop_complete_is_not_counted() -> None:
    m = new_job()
    m.handle(FaultReported(faults={0: "1"}), 1)
    m.handle(FaultReported(node_rank=1, faults={1: "1"}), 1)
    out = m.handle(StopComplete(node_rank=0, faults={0: "1"}), 2)  # answers the first stopTrain
    assert out.code == 0 and "earlier stopTrain" in out.info
    m.handle(StopComplete(node_rank=1, faults={0: "1", 1: "1"}), 2)
    assert m.state == S.STOPPING
    m.handle(StopComplete(node_rank=0, faults={0: "1", 1: "1"}), 2)
    assert m.state == S.COLLECTING


def test_fault_after_decision_is_queued_and_opens_the_next_round() -> None:
    m = new_job()
    play(m, round_steps({1: "2"}, ALL, "job-rescheduling")[:-1] + [
        Step(3, FaultReported(node_rank=0, faults={0: "1"}), S.RECOVERING, info="queued"),
        Step(4, RecoverStatusReported(node_rank=1, strategy="job-rescheduling"), S.STOPPING, signals=["stopTrain"]),
    ])
    assert m.round is not None and m.round.number == 2 and m.round.faults == {0: "1"}


def test_a_fault_queued_before_a_job_rescheduling_joins_it_instead_of_opening_a_round() -> None:
    """Ranks 3 and 1 die within a second: rank 1's report comes while recover of rank 3 runs (queued); that recover
    fails and the round escalates to job-rescheduling, which restarts every rank, rank 1 included. Rank 1's fault
    is of a process it replaced: it joins that round, and no second round recovers a rank already restarted
    (which waited out the rejoin timeout for a group nobody else re-forms)."""
    m = new_job()
    play(m, round_steps({3: "1"}, ALL, "recover")[:-2] + [
        Step(3, FaultReported(node_rank=0, faults={1: "1"}), S.RECOVERING, info="queued"),
        Step(3, RecoverStatusReported(node_rank=1, strategy="recover", code=1), S.RECOVERING,
             signals=["changeStrategy:job-rescheduling"]),
        Step(4, RecoverStatusReported(node_rank=0, strategy="job-rescheduling"), S.RECOVERING),
        Step(4, RecoverStatusReported(node_rank=1, strategy="job-rescheduling"), S.RUNNING),
    ])
    assert m.round is None and not m.queued and m.restarts == 1 and m.round_counter == 1


def test_a_fault_reported_before_the_nodes_job_rescheduling_status_joins_that_round() -> None:
    """A node's reports come in order: its fault report before its job-rescheduling status names a process that
    job-rescheduling restarts; after its status, a new fault (queued)."""
    m = new_job()
    play(m, round_steps({1: "2"}, ALL, "job-rescheduling")[:-2] + [
        Step(3, FaultReported(node_rank=0, faults={0: "1"}), S.RECOVERING, info="joined round 1"),
        Step(3, RecoverStatusReported(node_rank=0, strategy="job-rescheduling"), S.RECOVERING),
        Step(3, FaultReported(node_rank=0, faults={1: "1"}), S.RECOVERING, info="queued"),
        Step(4, RecoverStatusReported(node_rank=1, strategy="job-rescheduling"), S.STOPPING, signals=["stopTrain"]),
    ])
    assert m.round is not None and m.round.number == 2 and m.round.faults == {1: "1"}


def test_repeated_reports_are_idempotent() -> None:
    m = new_job()
    play(m, [
        Step(1, FaultReported(node_rank=1, faults={1: "1"}), S.STOPPING, signals=["stopTrain"]),
        Step(1, FaultReported(node_rank=1, faults={1: "1"}), S.STOPPING, info="already in round 1"),
        stop(0), stop(0),
        stop(1, state=S.COLLECTING, signals=["globalFault"]),
        Step(2, StrategiesReported(node_rank=0, strategies=ALL), S.COLLECTING),
        Step(2, StrategiesReported(node_rank=0, strategies=ALL), S.COLLECTING),
        Step(2, StrategiesReported(node_rank=1, strategies=ALL), S.RECOVERING, signals=["changeStrategy:recover"]),
        Step(3, FaultReported(node_rank=1, faults={1: "1"}), S.RECOVERING, info="queued"),
        Step(3, FaultReported(node_rank=1, faults={1: "1"}), S.RECOVERING, info="already queued"),
        Step(3, RecoverStatusReported(node_rank=0, strategy="recover"), S.RECOVERING),
        Step(3, RecoverStatusReported(node_rank=0, strategy="recover"), S.RECOVERING),
    ])


def test_duplicate_answer_after_the_phase_moved_on_is_fine_but_a_late_one_is_401() -> None:
    m = new_job()
    m.handle(FaultReported(faults={0: "1"}), 1)
    m.handle(StopComplete(node_rank=0), 1)
    m.handle(Tick(), 11)  # node 1 never answered: dropped from the round
    assert m.state == S.COLLECTING
    dup = m.handle(StopComplete(node_rank=0), 12)
    assert dup.code == 0 and "already counted" in dup.info
    late = m.handle(StopComplete(node_rank=1), 12)
    assert late.code == Code.OUT_OF_ORDER and late.info.startswith("job j1 is COLLECTING, not STOPPING")
    m.handle(StrategiesReported(node_rank=0, strategies=ALL), 12)
    assert m.state == S.RECOVERING
    assert m.handle(StrategiesReported(node_rank=0, strategies=ALL), 12).code == 0
    assert m.handle(StrategiesReported(node_rank=0, strategies=("exit",)), 12).code == Code.OUT_OF_ORDER


# ------------------------------------------------------------------ budget and settle window


def _full_round(m: JobMachine, t: float, faults: dict[int, str], supported=ALL) -> str:
    m.handle(FaultReported(faults=faults), t)
    m.handle(StopComplete(), t)
    out = m.handle(StrategiesReported(strategies=supported), t)
    chosen = out.signals[-1].strategy
    if m.state == S.RECOVERING:
        m.handle(RecoverStatusReported(strategy=chosen), t + 1)
    return chosen


def test_restart_budget_bounds_restarting_strategies() -> None:
    m = JobMachine("j1", CFG, 0, JobInit(node_count=1, max_restarts=2))
    m.handle(AgentRegistered(), 0)
    supported = ("recover", "job-rescheduling", "exit")
    assert _full_round(m, 100, {0: "1"}, supported) == "recover"
    assert _full_round(m, 200, {0: "1"}, supported) == "recover"
    assert m.restarts == 2
    assert _full_round(m, 300, {0: "1"}, supported) == "exit"
    assert m.state == S.FAILED and "restart budget spent (2/2)" in m.info


def test_default_budget_comes_from_config() -> None:
    assert JobMachine("j", CFG, 0).max_restarts == 3
    assert JobMachine("j", CFG, 0, JobInit(max_restarts=0)).max_restarts == 0


def test_settle_window_turns_recover_into_job_rescheduling_and_bans_it_after_two() -> None:
    m = new_job(nodes=1, max_restarts=10)
    assert _full_round(m, 100, {0: "1"}) == "recover"  # succeeds at t=101
    assert _full_round(m, 110, {0: "1"}) == "job-rescheduling"  # within 30 s: recover did not settle
    assert m.unsettled_recovers == 1 and not m.recover_banned
    assert _full_round(m, 500, {0: "1"}) == "recover"  # a fresh fault long after: recover is fine
    assert _full_round(m, 520, {0: "0"}) == "job-rescheduling"  # unsettled again (even retry is skipped)
    assert m.recover_banned
    assert _full_round(m, 900, {0: "1"}) == "job-rescheduling"  # never recover again


def test_queued_fault_after_recover_counts_as_unsettled() -> None:
    m = new_job(nodes=1)
    m.handle(FaultReported(faults={0: "1"}), 1)
    m.handle(StopComplete(), 1)
    m.handle(StrategiesReported(strategies=ALL), 1)
    m.handle(FaultReported(faults={0: "1"}), 2)  # the recovered rank again, queued during recover
    m.handle(RecoverStatusReported(strategy="recover"), 3)
    assert m.state == S.STOPPING and m.unsettled_recovers == 1
    assert "recover" in m.round.excluded
    assert m.round.tried == ["recover"]  # that recover pays for this round's restart: one in all
    m.handle(StopComplete(), 4)
    m.handle(StrategiesReported(strategies=ALL), 4)
    assert m.round.strategy == "job-rescheduling" and m.restarts == 1


def _recover_then_queue(faults_after: dict[int, str], rejoined: bool, nodes: int = 1) -> tuple[JobMachine, list]:
    """Rank 0 is recovered; `faults_after` is reported while the recover runs; every agent then reports it
    done, `rejoined` saying whether its ranks re-formed their group with the restarted one (live recovery)."""
    m = new_job(nodes=nodes)
    for n in range(nodes):
        m.handle(FaultReported(node_rank=n, faults={0: "1"}), 1)
    for n in range(nodes):
        m.handle(StopComplete(node_rank=n), 1)
    for n in range(nodes):
        m.handle(StrategiesReported(node_rank=n, strategies=ALL), 1)
    assert m.round.strategy == "recover"
    m.handle(FaultReported(faults=faults_after), 2)  # queued during recover
    records = []
    for n in range(nodes):
        records += m.handle(RecoverStatusReported(node_rank=n, strategy="recover", rejoined=rejoined), 3).records
    assert m.state == S.STOPPING
    return m, records


def test_a_survivors_fault_after_a_rejoined_recover_is_a_new_fault() -> None:
    """Independent faults in a live job: the group re-formed, so rank 1 failing next is recovered in place."""
    m, _ = _recover_then_queue({1: "1"}, rejoined=True)
    assert m.unsettled_recovers == 0 and "recover" not in m.round.excluded
    m.handle(StopComplete(), 4)
    m.handle(StrategiesReported(strategies=ALL), 4)
    assert m.round.strategy == "recover" and m.restarts == 2


def test_a_survivors_fault_after_a_recover_that_only_restarted_counts_as_unsettled() -> None:
    """Tightly coupled ranks (MindSpore under msrun): the replacement was only started, the survivor breaks."""
    m, records = _recover_then_queue({1: "1"}, rejoined=False)
    assert m.unsettled_recovers == 1 and "recover" in m.round.excluded
    assert "survivor" in m.round.excluded["recover"]
    [rec] = [r for r in records if r.kind == "recover_unsettled"]
    assert rec.detail["restarted_rank"] is False and rec.detail["rejoined"] is False
    m.handle(StopComplete(), 4)
    m.handle(StrategiesReported(strategies=ALL), 4)
    assert m.round.strategy == "job-rescheduling" and m.restarts == 1  # that recover pays: one in all


def test_one_agent_that_did_not_rejoin_leaves_the_recover_unconfirmed() -> None:
    m = new_job(nodes=2)
    for n in (0, 1):
        m.handle(FaultReported(node_rank=n, faults={0: "1"}), 1)
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n), 1)
    for n in (0, 1):
        m.handle(StrategiesReported(node_rank=n, strategies=ALL), 1)
    m.handle(RecoverStatusReported(node_rank=0, strategy="recover", rejoined=True), 2)
    m.handle(RecoverStatusReported(node_rank=1, strategy="recover", rejoined=False), 2)
    assert m.state == S.RUNNING and not m.recover_rejoined
    m.handle(FaultReported(node_rank=1, faults={3: "1"}), 5)
    assert m.unsettled_recovers == 1


def test_a_restarted_ranks_fault_counts_even_after_a_rejoined_recover() -> None:
    m, _ = _recover_then_queue({0: "1"}, rejoined=True)
    assert m.unsettled_recovers == 1 and "a rank it restarted" in m.round.excluded["recover"]


def test_outside_the_settle_window_nothing_counts() -> None:
    m = new_job(nodes=1)
    assert _full_round(m, 100, {0: "1"}) == "recover"  # not rejoined, succeeds at 101
    assert _full_round(m, 132, {1: "1"}) == "recover"  # 31 s later: a new fault
    assert m.unsettled_recovers == 0


def test_policy_limits_strategies() -> None:
    m = new_job(nodes=1, strategies=("job-rescheduling",))
    assert _full_round(m, 1, {0: "0"}) == "job-rescheduling"


# ------------------------------------------------------------------ wrong order, wrong agent

OUT_OF_ORDER = {
    "stop complete while running": ([], StopComplete(), "job j1 is RUNNING, not STOPPING"),
    "strategies while stopping": ([FaultReported(faults={0: "1"})], StrategiesReported(strategies=ALL),
                                  "job j1 is STOPPING, not COLLECTING"),
    "status while collecting": ([FaultReported(faults={0: "1"}), StopComplete()],
                                RecoverStatusReported(strategy="recover"), "is COLLECTING, not"),
    "status for another strategy": (
        [FaultReported(faults={0: "1"}), StopComplete(), StrategiesReported(strategies=ALL)],
        RecoverStatusReported(strategy="retry"), "carrying out recover, not retry"),
}


@pytest.mark.parametrize("before,event,info", OUT_OF_ORDER.values(), ids=OUT_OF_ORDER.keys())
def test_out_of_order_is_401_naming_the_state(before: list, event: Any, info: str) -> None:
    m = new_job(nodes=1)
    for e in before:
        assert m.handle(e, 1).code == 0
    state = m.state
    out = m.handle(event, 2)
    assert out.code == Code.OUT_OF_ORDER and info in out.info
    assert m.state == state and out.signals == []


def test_unregistered_agent_is_400() -> None:
    m = new_job(nodes=2)
    out = m.handle(FaultReported(node_rank=5, faults={0: "1"}), 1)
    assert out.code == Code.NOT_REGISTERED and "node 5" in out.info and m.state == S.RUNNING


def test_register_out_of_range_node_is_409() -> None:
    m = new_job(nodes=2)
    out = m.handle(AgentRegistered(node_rank=2), 1)
    assert out.code == Code.INVALID_PARAMS and "nodeRank" in out.info


def test_fault_on_a_finished_job_is_401() -> None:
    m = new_job(nodes=1)
    m.handle(AgentFinished(exit_code=0), 1)
    out = m.handle(FaultReported(faults={0: "1"}), 2)
    assert out.code == Code.OUT_OF_ORDER and "SUCCEEDED" in out.info


# ------------------------------------------------------------------ job end and init


def test_succeeded_when_every_agent_finished_zero() -> None:
    m = new_job()
    play(m, [
        Step(1, AgentFinished(node_rank=0, exit_code=0), S.RUNNING),
        Step(2, AgentFinished(node_rank=1, exit_code=0), S.SUCCEEDED),
    ])


def test_a_fault_after_another_node_finished_fails_at_once_instead_of_waiting_for_it() -> None:
    m = new_job(nodes=3, ranks_per_node=2)
    play(m, [Step(1, AgentFinished(node_rank=0), S.RUNNING)])
    out = m.handle(FaultReported(node_rank=2, faults={5: "1"}), 2)
    assert m.state == S.FAILED and m.deadline is None, "no stop timeout spent waiting for node 0"
    (sig,) = out.signals
    assert (sig.signal_type, sig.strategy) == (SignalType.CHANGE_STRATEGY, Strategy.EXIT)
    assert "rank(s) 5 failed after node(s) 0 had finished" in m.info and sig.reason == m.info
    assert [r.kind for r in out.records][:1] == ["fault_reported"]
    assert m.handle(FaultReported(node_rank=1, faults={2: "1"}), 3).code == Code.OUT_OF_ORDER


def test_non_zero_finish_fails_the_job_and_stops_the_others() -> None:
    m = new_job()
    play(m, [Step(1, AgentFinished(node_rank=1, exit_code=3, message="rank 2 exited 3"), S.FAILED,
                  signals=["changeStrategy:exit"])])
    assert "exit code 3" in m.info


def test_exit_status_reports_are_accepted_after_failure() -> None:
    m = new_job(nodes=1)
    _full_round(m, 1, {0: "1"}, ("exit",))
    assert m.state == S.FAILED
    assert m.handle(RecoverStatusReported(strategy="exit"), 2).code == 0
    assert m.handle(RecoverStatusReported(strategy="recover"), 2).code == Code.OUT_OF_ORDER


@pytest.mark.parametrize("event", [RecoverStatusReported(strategy="retry"), StopComplete(node_rank=0, code=1)],
                         ids=["refused by its handler", "no rule takes it"])
def test_a_refused_report_leaves_the_agents_liveness_as_it_was(event: Any) -> None:
    # found by tests/e2e/controller/test_fuzz.py: a refused call from node 0 moved its lastSeen
    m = new_job(nodes=1)
    _full_round(m, 1, {0: "1"}, ("exit",))
    agent = m.agents[0]
    m.handle(AgentDisconnected(node_rank=0), 3)
    before = agent.last_seen, agent.online, m.agents.online_count
    out = m.handle(event, 7)
    assert out.code == Code.OUT_OF_ORDER
    assert (agent.last_seen, agent.online, m.agents.online_count) == before
    assert m.handle(RecoverStatusReported(strategy="exit"), 8).code == 0  # an accepted one still counts
    assert agent.last_seen == 8 and agent.online


INIT_CASES = {
    "finished job is reset by a new run": (True, True, 999, "reset"),
    "finished job: its own agent re-Inits and joins": (True, True, 100, "joined"),
    "an online agent makes init a join": (False, True, 999, "joined"),
    "a known agent (host, pid) rejoins": (False, False, 100, "joined"),
    "nobody online, unknown caller: reset": (False, False, 999, "reset"),
}


@pytest.mark.parametrize("finished,online,pid,expect", INIT_CASES.values(), ids=INIT_CASES.keys())
def test_init_joins_or_resets(finished: bool, online: bool, pid: int, expect: str) -> None:
    m = new_job(nodes=1)
    m.handle(FaultReported(faults={0: "1"}), 1)
    if finished:
        m.handle(AgentFinished(exit_code=1), 2)
    if not online:
        m.handle(AgentDisconnected(), 2)
        m.agents.set_online(m.agents[0], False)
    out = m.handle(JobInit(node_count=1, host="h", pid=pid), 3)
    assert out.code == 0 and expect in out.info
    if expect == "reset":
        assert m.state == S.RUNNING and m.agents == {} and m.round is None and m.restarts == 0
    else:
        assert 0 in m.agents


def test_the_nodes_of_one_start_racing_to_init_join_the_job_the_first_created() -> None:
    """Node 1's Init arriving before node 0 registered is the same start, not a new run: no job_reset (CI saw
    one in every 2-node start on a loaded machine, and an operator reads it as a lost run)."""
    m = JobMachine("j", CFG, 0.0, JobInit(node_count=2, ranks_per_node=2, host="a", pid=1))
    out = m.handle(JobInit(node_count=2, ranks_per_node=2, node_rank=1, host="b", pid=2), 0.1)
    assert out.code == 0 and [r.kind for r in out.records] == ["job_joined"], out.records
    # the same race with another shape is a new run asked for: it takes the new shape
    other = m.handle(JobInit(node_count=3, ranks_per_node=2, node_rank=1, host="b", pid=2), 0.2)
    assert [r.kind for r in other.records] == ["job_reset"] and m.node_count == 3, other.records
    # once an agent registered, an unknown Init while it is online joins; the race rule no longer applies
    m.handle(AgentRegistered(node_rank=0, host="a", pid=1), 0.3)
    m.handle(AgentDisconnected(node_rank=0), 0.4)
    m.agents.set_online(m.agents[0], False)
    late = m.handle(JobInit(node_count=3, ranks_per_node=2, node_rank=1, host="c", pid=3), 0.5)
    assert [r.kind for r in late.records] == ["job_reset"], late.records


# ------------------------------------------------------------------ the decision alone (pure)


@dataclass
class Policy:
    policy: tuple[str, ...] = ()
    restarts: int = 0
    max_restarts: int = 3
    recover_banned: bool = False


CHOICES = {
    "type-0 faults: retry": ({1: "0"}, Policy(), ALL, "retry", {}),
    "a process fault skips retry": ({1: "1"}, Policy(), ALL, "recover", {"retry": "fault types ['1'] are not"}),
    "budget spent: dump": ({1: "1"}, Policy(restarts=3), ALL, "dump", {"job-rescheduling": "restart budget spent"}),
    "recover banned": ({1: "1"}, Policy(recover_banned=True), ALL, "job-rescheduling", {"recover": "failed to settle"}),
    "the job's policy": ({1: "0"}, Policy(policy=("dump", "exit")), ALL, "dump", {"retry": "not allowed by the job"}),
    "what an agent lacks": ({1: "2"}, Policy(), ("dump", "exit"), "dump", {"job-rescheduling": "not supported by"}),
}


@pytest.mark.parametrize("faults,job,offered,chosen,why", CHOICES.values(), ids=CHOICES.keys())
def test_choose_strategy(faults: dict[int, str], job: Policy, offered: tuple[str, ...], chosen: str,
                         why: dict[str, str]) -> None:
    r = Round(number=1, started_at=0, faults=faults, participants={0, 1}, reports={0: ALL, 1: offered})
    got, skipped = choose_strategy(job, r)
    assert got == chosen and list(skipped) == list(Strategy.ORDER[:Strategy.ORDER.index(chosen)])
    assert all(text in skipped[s] for s, text in why.items()), skipped


def test_choose_strategy_exits_when_nobody_answered() -> None:
    r = Round(number=1, started_at=0, faults={1: "0"}, participants=set())
    assert choose_strategy(Policy(), r) == ("exit", {"*": "no agent of the job answered"})


# ------------------------------------------------------------------ restart of the controller


def test_snapshot_restore_mid_round_resumes_when_all_agents_are_back() -> None:
    m = new_job()
    m.handle(FaultReported(faults={1: "1"}), 1)
    m.handle(StopComplete(node_rank=0), 1)
    m.handle(StopComplete(node_rank=1), 1)
    m.handle(StrategiesReported(node_rank=0, strategies=ALL), 1)
    snap = m.snapshot()
    agents = list(m.agents.values())
    r, out = JobMachine.restore(snap, agents, CFG, 50)
    assert r.state == S.RESUMING and r.deadline == 50 + CFG.resume_timeout
    assert r.handle(StopComplete(node_rank=0), 51).code == Code.OUT_OF_ORDER
    assert r.handle(FaultReported(node_rank=0, faults={0: "1"}), 51).code == 0  # merged, round not decided
    assert r.handle(AgentConnected(node_rank=0), 52).signals == []
    out = r.handle(AgentConnected(node_rank=1), 53)
    assert r.state == S.STOPPING and sig_names(out) == ["stopTrain"]
    assert out.signals[0].faults == ((0, "1"), (1, "1"))
    assert r.round.number == 1


def test_restore_resumes_on_timeout_without_missing_agents() -> None:
    m = new_job()
    m.handle(FaultReported(faults={1: "1"}), 1)
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 50)
    r.handle(AgentConnected(node_rank=0), 51)
    out = r.handle(Tick(), 50 + CFG.resume_timeout)
    assert r.state == S.STOPPING and sig_names(out) == ["stopTrain"]


def test_restore_keeps_settled_state_and_budget() -> None:
    m = new_job(nodes=1, max_restarts=5)
    _full_round(m, 1, {0: "1"})
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 10)
    assert r.state == S.RUNNING and r.restarts == 1 and r.max_restarts == 5
    assert r.recover_succeeded_at == m.recover_succeeded_at


def _resume_after_a_crash(m: JobMachine, t: float) -> tuple[JobMachine, list[Any]]:
    """The controller dies in RECOVERING (SIGKILL: only the snapshot is left), comes back, the agents resubscribe;
    returns the job and the signals each agent got as it resubscribed (the changeStrategy it still owes)."""
    r, _ = JobMachine.restore(m.snapshot(), [a.copy() for a in m.agents.values()], CFG, t)
    owed = []
    for n in r.agents:
        owed += r.handle(AgentConnected(node_rank=n), t).direct
    return r, owed


def test_a_restart_interrupted_by_a_controller_crash_is_charged_once() -> None:
    """L4, issue 31 F2: the round's strategy spent a restart when chosen; the restored round goes on with it (the
    same changeStrategy to the agents that owe its status), chosen and charged once."""
    m = new_job(max_restarts=3)
    m.handle(FaultReported(faults={1: "2"}), 1)  # a network fault: job-rescheduling
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n), 1)
    for n in (0, 1):
        sent = m.handle(StrategiesReported(node_rank=n, strategies=ALL), 1).signals
    assert m.state == S.RECOVERING and m.round.strategy == "job-rescheduling" and m.restarts == 1
    r, owed = _resume_after_a_crash(m, 50)
    assert r.state == S.RECOVERING and owed == sent * 2 and r.restarts == 1  # the very signal: its uuid, generation
    for n in (0, 1):
        r.handle(RecoverStatusReported(node_rank=n, strategy="job-rescheduling"), 51)
    assert r.state == S.RUNNING and r.restarts == 1
    r.handle(FaultReported(faults={1: "2"}), 52)  # the next round pays again
    for n in (0, 1):
        r.handle(StopComplete(node_rank=n), 52)
    for n in (0, 1):
        r.handle(StrategiesReported(node_rank=n, strategies=ALL), 52)
    assert r.round.strategy == "job-rescheduling" and r.restarts == 2


def test_a_crash_when_the_budget_was_just_spent_does_not_end_the_job() -> None:
    """With the last restart spent on the interrupted strategy, charging it again would have found the budget
    empty and chosen dump: the job would have ended for the controller's crash, not for a fault."""
    m = new_job(max_restarts=1)
    m.handle(FaultReported(faults={1: "2"}), 1)
    for n in (0, 1):
        m.handle(StopComplete(node_rank=n), 1)
    for n in (0, 1):
        m.handle(StrategiesReported(node_rank=n, strategies=ALL), 1)
    assert m.round.strategy == "job-rescheduling" and m.restarts == 1 == m.max_restarts
    r, owed = _resume_after_a_crash(m, 50)
    assert [s.strategy for s in owed] == ["job-rescheduling"] * 2  # not dump
    assert r.restarts == 1 and r.round.tried == ["job-rescheduling"]


def test_reconnecting_agent_gets_the_signal_it_still_owes() -> None:
    m = new_job()
    m.handle(FaultReported(faults={1: "1"}), 1)
    m.handle(StopComplete(node_rank=0), 1)
    m.handle(AgentDisconnected(node_rank=1), 2)
    out = m.handle(AgentConnected(node_rank=1), 3)
    assert [s.signal_type for s in out.direct] == ["stopTrain"] and out.signals == []
    assert m.handle(AgentConnected(node_rank=0), 3).direct == []  # node 0 already answered


# ------------------------------------------------------------------ a lost agent


@dataclass
class Fired:
    events: list[Any]
    signals: list[Any]
    records: list[Any]


def fire(m: JobMachine, t: float) -> Fired:
    """Deliver the timer events due at `t`, as the controller's timer does; their merged outcome."""
    events = m.due_events(t)
    outs = [m.handle(ev, t) for ev in events]
    return Fired(events, [s for o in outs for s in o.signals], [r for o in outs for r in o.records])


FAST_LOSS = replace(CFG, agent_loss_timeout=5)  # shorter than the round's waits, to be lost mid-round


def _enter(state: S) -> JobMachine:
    """A 2-node job in `state`, every deadline of its round still far away at t=10."""
    m = new_job(cfg=FAST_LOSS)
    steps = round_steps({1: "1"}, ALL, "recover")
    upto = {S.RUNNING: 0, S.STOPPING: 1, S.COLLECTING: 3, S.RECOVERING: 5}[state]
    play(m, steps[:upto])
    assert m.state == state
    return m


@pytest.mark.parametrize("state", [S.RUNNING, S.STOPPING, S.COLLECTING, S.RECOVERING], ids=lambda s: s.value)
def test_lost_agent_fails_the_job_and_tells_the_others_to_exit(state: S) -> None:
    m = _enter(state)
    m.handle(AgentDisconnected(node_rank=1), 5)
    assert m.wake_at == 10 and m.state == state
    assert fire(m, 9.9).events == []  # not yet due
    fired = fire(m, 10)
    assert m.state == S.FAILED and sig_names(fired) == ["changeStrategy:exit"]
    assert m.info == "agent of node 1 lost for 5s: nothing can restart its ranks"
    (lost,) = [r for r in fired.records if r.kind == "agent_lost"]
    assert lost.detail["node_rank"] == 1 and lost.detail["seconds"] == 5 and lost.detail["pid"] == 101
    (ended,) = [r for r in fired.records if r.kind == "round_ended"]
    assert ended.detail["outcome"] == "failed" and ended.detail["strategy"] == "exit"
    assert m.wake_at is None and m.deadline is None
    # the remaining agent confirms the exit as usual
    assert m.handle(RecoverStatusReported(node_rank=0, strategy="exit"), 11).code == 0


def test_reconnect_within_the_timeout_cancels_the_loss() -> None:
    m = new_job()
    play(m, [
        Step(5, AgentDisconnected(node_rank=1), S.RUNNING),
        Step(34, AgentConnected(node_rank=1), S.RUNNING),  # a network blip, 29 s long
    ])
    assert m.wake_at is None and fire(m, 100).events == [] and m.state == S.RUNNING
    m.handle(AgentDisconnected(node_rank=1), 200)  # a later loss gets a whole timeout of its own
    assert m.wake_at == 230
    assert fire(m, 229).events == [] and m.state == S.RUNNING
    assert sig_names(fire(m, 230)) == ["changeStrategy:exit"] and m.state == S.FAILED


def test_an_agent_that_registers_but_never_subscribes_is_lost_too() -> None:
    m = JobMachine("j1", CFG, 0.0, JobInit(node_count=2))
    m.handle(AgentRegistered(node_rank=0, host="h", pid=100), 0)
    m.handle(AgentConnected(node_rank=0), 1)
    m.handle(AgentRegistered(node_rank=1, host="h", pid=101), 2)  # its node died before it subscribed
    assert m.wake_at == 32
    fired = fire(m, 32)
    assert m.state == S.FAILED and sig_names(fired) == ["changeStrategy:exit"] and "node 1 lost" in m.info


def test_a_stale_loss_event_changes_nothing() -> None:
    m = new_job()
    m.handle(AgentDisconnected(node_rank=1), 5)
    m.handle(AgentConnected(node_rank=1), 6)
    out = m.handle(AgentLossDue(), 40)  # e.g. a timer set before the agent came back
    assert out.code == 0 and out.signals == [] and m.state == S.RUNNING


def test_finished_agents_are_not_lost() -> None:
    m = new_job(nodes=3)
    play(m, [
        Step(1, AgentFinished(node_rank=0), S.RUNNING),
        Step(2, AgentDisconnected(node_rank=0), S.RUNNING),  # finished, then left: done, not lost
        Step(3, AgentDisconnected(node_rank=1), S.RUNNING),  # left first, finished later: not lost either
        Step(4, AgentFinished(node_rank=1), S.RUNNING),
    ])
    assert m.gone_agents() == {} and m.wake_at is None and fire(m, 100).events == []
    play(m, [Step(101, AgentFinished(node_rank=2), S.SUCCEEDED)])


def test_lost_agent_when_the_others_finished_fails_without_signals() -> None:
    m = new_job()
    m.handle(AgentFinished(node_rank=0), 1)
    m.handle(AgentDisconnected(node_rank=0), 1)
    m.handle(AgentDisconnected(node_rank=1), 2)
    fired = fire(m, 32)
    assert m.state == S.FAILED and fired.signals == [] and "node 1 lost for 30s" in m.info


def test_single_agent_job_whose_agent_is_lost_is_failed() -> None:
    m = new_job(nodes=1)
    m.handle(AgentDisconnected(), 1)
    fired = fire(m, 31)
    assert m.state == S.FAILED and fired.signals == []  # nobody left to tell
    assert [r.kind for r in fired.records] == ["agent_lost", "job_failed", "state"]
    assert m.info == "agent of node 0 lost for 30s: nothing can restart its ranks"


def test_several_agents_lost_at_once_are_named_together() -> None:
    m = new_job(nodes=3)
    m.handle(AgentDisconnected(node_rank=2), 1)
    m.handle(AgentDisconnected(node_rank=1), 2)
    fired = fire(m, 40)
    assert [r.detail["node_rank"] for r in fired.records if r.kind == "agent_lost"] == [1, 2]
    assert m.info == "agents of nodes 1, 2 lost for 39s: nothing can restart their ranks"
    assert sig_names(fired) == ["changeStrategy:exit"]


def test_loss_comes_before_a_round_timeout_due_at_the_same_time() -> None:
    m = new_job(cfg=replace(CFG, agent_loss_timeout=10))
    m.handle(FaultReported(faults={1: "1"}), 1)  # stop deadline 11
    m.handle(AgentDisconnected(node_rank=1), 1)  # lost at 11 too
    fired = fire(m, 11)
    assert [type(e).__name__ for e in fired.events] == ["AgentLossDue", "Tick"]
    assert m.state == S.FAILED and sig_names(fired) == ["changeStrategy:exit"]


def test_an_agent_declared_lost_that_comes_back_to_the_job_it_failed_is_fenced() -> None:
    m = new_job()
    m.handle(AgentDisconnected(node_rank=1), 1)
    fire(m, 31)
    assert m.state == S.FAILED
    # the lost agent comes back: its Init, Register and stream are refused as fenced (issue 31: in every state),
    # so it stops its ranks and exits 1, and nothing of the failed job changes
    for ev in (JobInit(node_count=2, node_rank=1, host="h", pid=101), AgentRegistered(node_rank=1, host="h", pid=101),
               AgentConnected(node_rank=1, host="h", pid=101)):
        out = m.handle(ev, 40)
        assert out.code == Code.FENCED and "the job is FAILED: this agent must stop its ranks" in out.info, out.info
    assert m.state == S.FAILED and not m.agents[1].subscribed
    # a new run of the job (another process) still starts afresh
    assert "reset" in m.handle(JobInit(node_count=2, host="h", pid=555), 50).info and m.state == S.RUNNING


def test_a_failed_jobs_node_that_died_is_refused_to_its_pod_started_again() -> None:
    """Issue 32, item 8: node 1's agent died without finishing and the job FAILED; a new process Initing as node 1
    is its pod recreated (Kubernetes), not a new run: refused 409, the job stays as it ended. A node whose agent
    finished (node 0, after killMaster) still starts a new run, which node 1 then joins."""
    m = new_job()
    m.handle(AgentDisconnected(node_rank=1), 1)
    fire(m, 31)
    assert m.state == S.FAILED
    m.handle(AgentFinished(node_rank=0, exit_code=1), 32)
    out = m.handle(JobInit(node_count=2, node_rank=1, host="h", pid=555), 40)
    assert out.code == Code.INVALID_PARAMS and m.state == S.FAILED, out
    assert out.info.startswith("job j1 FAILED (") and "a new job id" in out.info, out.info
    assert [r.kind for r in out.records] == ["rerun_refused"] and 1 in m.agents and m.agents[0].finished
    assert "reset" in m.handle(JobInit(node_count=2, node_rank=0, host="h", pid=556), 41).info
    assert "joined" in m.handle(JobInit(node_count=2, node_rank=1, host="h", pid=555), 42).info


def test_late_subscriber_to_a_failed_job_gets_kill_master() -> None:
    """An agent the job failed without (its stream was down, never declared lost) learns it from killMaster."""
    m = new_job()
    m.handle(AgentDisconnected(node_rank=1), 1)
    m.handle(AgentFinished(node_rank=0, exit_code=3, message="boom"), 2)
    assert m.state == S.FAILED
    assert "joined" in m.handle(JobInit(node_count=2, node_rank=1, host="h", pid=101), 3).info
    assert m.handle(AgentRegistered(node_rank=1, host="h", pid=101), 3).code == 0
    out = m.handle(AgentConnected(node_rank=1, host="h", pid=101), 3)
    assert [s.signal_type for s in out.direct] == [SignalType.KILL_MASTER] and out.signals == []
    assert m.state == S.FAILED and [r.kind for r in out.records] == ["agent_subscribed", "kill_master"]


def test_subscriber_to_a_succeeded_job_gets_nothing() -> None:
    m = new_job()
    m.handle(AgentFinished(node_rank=0), 1)
    m.handle(AgentFinished(node_rank=1), 1)
    assert m.state == S.SUCCEEDED
    out = m.handle(AgentConnected(node_rank=1), 2)
    assert out.direct == [] and out.signals == [] and m.state == S.SUCCEEDED


def test_resuming_keeps_its_own_timeout_then_a_missing_agent_is_lost() -> None:
    m = new_job()
    m.handle(FaultReported(faults={1: "1"}), 1)
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 50)
    r.handle(AgentConnected(node_rank=0), 51)
    assert r.wake_at == 50 + CFG.resume_timeout  # no loss while RESUMING (resume timeout 20 < loss 30)
    assert sig_names(fire(r, 70)) == ["stopTrain"] and r.state == S.STOPPING
    assert r.wake_at == 80  # node 1 has been gone since the restart
    fired = fire(r, 80)
    assert r.state == S.FAILED and sig_names(fired) == ["changeStrategy:exit"]
    assert "node 1 lost for 30s" in r.info


def test_restored_running_job_waits_one_loss_timeout_for_its_agents() -> None:
    m = new_job()
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 100)
    assert r.state == S.RUNNING and r.wake_at == 130
    r.handle(AgentConnected(node_rank=0), 101)
    r.handle(AgentConnected(node_rank=1), 129)
    assert r.wake_at is None and fire(r, 200).events == [] and r.state == S.RUNNING


# ------------------------------------------------------------------ the table itself


def test_every_state_handles_every_report_or_answers_401() -> None:
    events = [StopComplete(), StrategiesReported(strategies=ALL), RecoverStatusReported(strategy="recover"),
              FaultReported(faults={0: "1"}), AgentFinished(), Tick(), AgentConnected(), AgentDisconnected(),
              AgentLossDue()]
    for state in JobState:
        for ev in events:
            m = new_job(nodes=1)
            m.handle(FaultReported(faults={0: "1"}), 1)
            m.state = state
            if state in (S.RUNNING, S.SUCCEEDED):
                m.round = None
            if state == S.RECOVERING:
                m.round.strategy = Strategy.RECOVER
            out = m.handle(ev, 2)  # never raises: a table target mismatch would
            assert out.code in (0, Code.OUT_OF_ORDER), (state, ev, out.info)


def test_table_is_readable() -> None:
    text = describe_table()
    assert len(text.splitlines()) == len(RULES)
    assert "STOPPING" in text and "on_stop_complete" in text


def _line(text: str, handler: str) -> str:
    (line,) = [row for row in text.splitlines() if f"{handler}" in row.split()]
    return line


def test_table_prints_the_real_targets_of_handlers_that_end_the_job() -> None:
    text = describe_table()
    assert "SUCCEEDED, FAILED, unchanged" in _line(text, "on_finished")
    assert "FAILED, unchanged" in _line(text, "on_join_timeout")
    assert "RUNNING, unchanged" in _line(text, "on_init")
    assert "same" not in text
    for rule in RULES:  # "any state" is no target: every rule names where it can lead
        assert rule.targets and rule.targets != frozenset(JobState) | {UNCHANGED}, rule.handler.__name__


def test_at_most_one_rule_per_event_and_state_so_order_is_irrelevant() -> None:
    assert sum(len(r.sources) for r in RULES) == len(table.INDEX)  # no (event, state) pair claimed twice
    assert table.index_rules(reversed(RULES)) == table.INDEX
    overlapping = Rule(frozenset({S.RUNNING}), FaultReported, frozenset({S.RUNNING}), handlers.on_fault_queue)
    with pytest.raises(ValueError, match="FaultReported in RUNNING is claimed by both on_fault_running and "
                                         "on_fault_queue"):
        table.index_rules((*RULES, overlapping))


def _bad_stop(m: Any, ev: Any, now: float, out: Any) -> JobState:
    return S.SUCCEEDED  # a round's fault cannot end the job well


def _to_stopping(m: Any, ev: Any, now: float, out: Any) -> JobState:
    return S.STOPPING


def test_target_check_raises_for_a_handler_that_lands_outside_its_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    m = new_job()
    rule = Rule(frozenset({S.RUNNING}), FaultReported, frozenset({S.STOPPING, S.FAILED}), _bad_stop)
    monkeypatch.setitem(table.INDEX, (FaultReported, S.RUNNING), rule)
    with pytest.raises(TransitionError, match="_bad_stop moved RUNNING to SUCCEEDED, table allows STOPPING, FAILED"):
        m.handle(FaultReported(faults={1: "1"}), 1)
    assert m.state == S.RUNNING  # the bad target never became the job's state


def test_unchanged_allows_only_the_state_the_job_was_in(monkeypatch: pytest.MonkeyPatch) -> None:
    m = new_job()
    stays = Rule(frozenset({S.RUNNING}), AgentRegistered, frozenset({UNCHANGED}), handlers.on_register)
    monkeypatch.setitem(table.INDEX, (AgentRegistered, S.RUNNING), stays)
    assert m.handle(AgentRegistered(node_rank=1, host="h", pid=101), 1).code == 0 and m.state == S.RUNNING
    moves = Rule(frozenset({S.RUNNING}), AgentRegistered, frozenset({UNCHANGED}), _to_stopping)
    monkeypatch.setitem(table.INDEX, (AgentRegistered, S.RUNNING), moves)
    with pytest.raises(TransitionError, match="_to_stopping moved RUNNING to STOPPING, table allows unchanged"):
        m.handle(AgentRegistered(node_rank=1, host="h", pid=101), 2)
    assert moves.allows(S.STOPPING, S.STOPPING) and not moves.allows(S.RUNNING, S.STOPPING)


def test_late_answer_rules_decline_the_rest_as_if_no_rule_took_it() -> None:
    m = new_job()
    play(m, round_steps({1: "1"}, ALL, "recover")[:3])  # both confirmed the stop: COLLECTING
    assert m.handle(StopComplete(node_rank=0), 2).code == 0  # a retry of a counted answer
    out = m.handle(StopComplete(node_rank=0, code=1, info="late failure"), 2)
    assert out.code == Code.OUT_OF_ORDER and out.records == [] and m.state == S.COLLECTING
    assert out.info == "job j1 is COLLECTING, not STOPPING (StopComplete refused)"  # the late-answer rule unnamed


def test_docs_table_is_generated_from_the_current_rules(tmp_path: Path) -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "controller.md"
    text = doc.read_text(encoding="utf-8")
    assert table.update_doc(text) == text, "run: python -m taskd.controller.machine.table --write docs/controller.md"
    stale = tmp_path / "controller.md"
    stale.write_text(text.replace("on_agent_lost", "on_something_else"), encoding="utf-8")
    assert table.main(["--check", str(stale)]) == 1
    assert table.main(["--write", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == text
    assert table.main(["--check", str(stale)]) == 0


# ------------------------------------------------------------------ the per-agent indexes (O(1) events)


def counts(m: JobMachine) -> tuple[int, int, int]:
    """The job's derived agent counts: online, subscribed (expected nodes), finished with 0."""
    return m.agents.online_count, m.agents.subscribed_count, m.agents.finished_ok_count


def test_agent_counters_follow_register_subscribe_finish_and_reset() -> None:
    m = new_job(nodes=3)
    assert counts(m) == (3, 3, 0) and m.agents.problems() == []
    m.handle(AgentDisconnected(node_rank=2), 1)
    assert counts(m)[:2] == (2, 2) and m.wake_at == 1 + CFG.agent_loss_timeout
    m.handle(AgentConnected(node_rank=2), 2)  # back in time: no loss clock any more
    assert counts(m)[:2] == (3, 3) and m.wake_at is None
    m.handle(AgentFinished(node_rank=0), 3)
    m.handle(AgentDisconnected(node_rank=1), 3)  # node 1's agent is gone (a live one keeps its node) ...
    # ... until it is declared lost (issue 17: the job fails here, node 0 having finished) ...
    fire(m, 3 + CFG.agent_loss_timeout)
    assert m.state == S.FAILED
    m.handle(AgentRegistered(node_rank=1, host="other", pid=7), 34)  # ... then a new process takes node 1 over
    m.handle(AgentConnected(node_rank=1), 34)
    assert m.agents.finished_ok_count == 1 and [a.node_rank for a in m.agents.at("other", 7)] == [1]
    assert m.agents.at("h", 101) == [] and [a.node_rank for a in m.agents.at("h", 100)] == [0]
    assert m.agents.problems() == []
    # the job ended badly; a new run (unknown process, nobody online) resets it: indexes empty too
    m.handle(AgentFinished(node_rank=1, exit_code=3), 35)
    for n in (1, 2):
        m.handle(AgentDisconnected(node_rank=n), 35)
    assert m.state == S.FAILED and m.agents.online_count == 1  # node 0 finished but its stream never closed
    m.agents.set_online(m.agents[0], False)  # as if its stream had closed long ago
    assert "reset" in m.handle(JobInit(node_count=2, host="h", pid=999), 36).info
    assert counts(m) == (0, 0, 0)
    assert m.agents == {} and m.agents.at("h", 100) == [] and m.wake_at is None and m.agents.problems() == []


def test_init_joins_by_host_and_pid_without_scanning() -> None:
    m = new_job(nodes=2)
    for n in (0, 1):
        m.handle(AgentDisconnected(node_rank=n), 1)
    assert m.agents.online_count == 0
    assert "joined" in m.handle(JobInit(node_count=2, host="h", pid=101), 2).info  # node 1's process
    assert "reset" in m.handle(JobInit(node_count=2, host="elsewhere", pid=101), 3).info


def test_indexes_are_rebuilt_on_restore_and_the_source_job_keeps_its_own() -> None:
    m = new_job(nodes=3)
    m.handle(FaultReported(faults={1: "1"}), 1)
    m.handle(AgentFinished(node_rank=2), 1)
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 50)
    assert r.agents.problems() == [] and counts(r) == (0, 0, 1)
    assert [a.node_rank for a in r.agents.at("h", 101)] == [1]
    assert all(r.agents[n] is not m.agents[n] for n in m.agents)  # restore copies the agents it is given
    assert m.agents.problems() == [] and m.agents.subscribed_count == 3
    for n in range(3):
        r.handle(AgentConnected(node_rank=n), 51 + n)
        assert r.agents.problems() == []
    assert r.state == S.STOPPING  # resumed when the third came back (counted, not scanned)


def test_loss_clock_follows_the_earliest_unfinished_gone_agent() -> None:
    m = new_job(nodes=3)
    m.handle(AgentDisconnected(node_rank=0), 1)
    m.handle(AgentDisconnected(node_rank=1), 2)
    assert m.wake_at == 1 + CFG.agent_loss_timeout
    m.handle(AgentFinished(node_rank=0), 3)  # finished agents are not lost
    assert m.wake_at == 2 + CFG.agent_loss_timeout
    for _ in range(200):  # a flapping agent must not grow the loss heap without bound
        m.handle(AgentConnected(node_rank=2), 4)
        m.handle(AgentDisconnected(node_rank=2), 4)
    assert len(m.agents._gone_heap) <= 2 * len(m.agents) + 65 and m.agents.problems() == []
    m.handle(AgentConnected(node_rank=1), 5)
    assert m.wake_at == 4 + CFG.agent_loss_timeout


def test_thousands_of_agents_subscribe_in_linear_time() -> None:
    """5,000 agents join, register, subscribe, and resubscribe after a restore, counted rather than scanned
    (no timing asserted: with a scan per event this test alone took minutes)."""
    n = 5000
    m = JobMachine("big", CFG, 0.0, JobInit(node_count=n))
    for k in range(n):
        assert m.handle(JobInit(node_count=n, node_rank=k, host=f"h{k}", pid=k + 1), 0.0).code == 0
        assert m.handle(AgentRegistered(node_rank=k, host=f"h{k}", pid=k + 1), 0.0).code == 0
        m.handle(AgentConnected(node_rank=k), 0.0)
    assert counts(m)[:2] == (n, n) and m.wake_at is None and m.agents.problems() == []
    m.handle(FaultReported(faults={0: "1"}), 1)
    r, _ = JobMachine.restore(m.snapshot(), list(m.agents.values()), CFG, 2)
    resumed = [r.handle(AgentConnected(node_rank=k), 3).signals for k in range(n)]
    assert all(not s for s in resumed[:-1]) and [s.signal_type for s in resumed[-1]] == ["stopTrain"]
