"""The supervisor feeds the round machine one event at a time: a rank found gone when START_WORKER_LIST returns
is judged after the restart's handler returned (today's re-entry, `_restart` -> `_start` -> `_fault`, is gone).

No process is started: the launcher's callbacks are stand-ins, the pids name no process, and the agent has no
controller (its reports are no-ops)."""

from __future__ import annotations

from types import SimpleNamespace

from taskd.agent.config import AgentConfig
from taskd.agent.link.orders import Command, Order
from taskd.agent.ranks.table import RankLayout, RankState
from taskd.agent.round import events as ev
from taskd.agent.round.states import NodeFacts, NodeState
from taskd.agent.supervisor import Supervisor
from taskd.callbacks import KILL_WORKER, MONITOR, START_ALL_WORKER, START_WORKER_LIST, STATUS_FAILED
from taskd.vocabulary import Action, SignalType, Strategy
from taskd.worker.env import Var

NO_PID = 4_194_000  # above any pid this machine hands out in a test run


def test_a_rank_gone_when_its_restart_returns_is_handled_after_the_restart(monkeypatch) -> None:
    monkeypatch.setenv(Var.TASKD_AGENT_BELL, "")  # the agent exports its doorbell: taken back after the test
    started: list[list[int]] = []
    callbacks = {
        MONITOR: lambda ranks: {1: {"pid": NO_PID + 2, "status": STATUS_FAILED}},  # the new rank 1: already gone
        START_WORKER_LIST: lambda ranks: started.append(list(ranks)) or 0,
        START_ALL_WORKER: lambda: 0,
        KILL_WORKER: lambda pids: 0,
    }
    sup = Supervisor(AgentConfig(launcher="taskd"), callbacks)
    try:
        sup.table.lay_out(RankLayout(0, 1, (0, 1)))
        sup.machine.facts = NodeFacts(node_count=1)
        r0, r1 = sup.table[0], sup.table[1]
        r0.pid, r0.state = NO_PID, RankState.RUNNING
        r1.pid, r1.state = NO_PID + 1, RankState.FAILED  # its fault opened the round
        sup.machine.state, sup.machine.faults, sup.machine.started = NodeState.STOPPING, {1: "1"}, 1.0

        trace: list[tuple[str, str, str, int, int]] = []
        handle = sup.machine.handle

        def traced(event: object, now: float) -> list:
            before = sup.machine.state.value
            actions = handle(event, now)
            trace.append((type(event).__name__, before, sup.machine.state.value, len(sup.result.faults),
                          len(sup.result.recoveries)))
            return actions

        sup.machine.handle = traced  # type: ignore[method-assign]
        sig = SimpleNamespace(uuid="j-1-2", signal_type=SignalType.CHANGE_STRATEGY, actions=[Action.CHANGE_STRATEGY],
                              fault_ranks={1: "1"}, strategy=Strategy.RECOVER, timeout=30, extra_params="")
        sup._feed(ev.ChangeOrder(Order.of(Command.CHANGE, sig)))
    finally:
        sup.watch.close()
        sup.hang.close()
        sup.live.close()
    assert started == [[1]]
    assert trace == [
        ("ChangeOrder", "STOPPING", "RESTARTING", 0, 0),
        ("StartResult", "RESTARTING", "RESUMING", 0, 0),  # (the counts are read before its actions run)
        ("Resumed", "RESUMING", "RUNNING", 0, 1),  # restart recorded, gone rank not judged yet; no heartbeats
        ("RankFault", "RUNNING", "REPORTING", 1, 1),  # a round of its own, after the restart's
    ], trace
    assert sup.result.faults[0].global_rank == 1 and sup.result.faults[0].pid == NO_PID + 2
