"""The tests of tests/e2e/controller/test_soft_history.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: Soft history (streams opened and closed) is batched,
not one SQLite transaction per agent;
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.controller import kinds

from taskd.controller.core import ControllerCore
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentRegistered,
    FaultReported,
    JobInit,
    MachineConfig,
)
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.store import Store

N = 50


def test_subscriptions_are_batched_and_written_before_the_next_commit(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "state.sqlite3")
        commits: list[str] = []
        store.conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        core = ControllerCore(MachineConfig(), store, SignalHub(), soft_flush_delay=0.05)
        assert core.init_job("j", JobInit(node_count=N)).code == 0
        for n in range(N):
            assert core.dispatch("j", AgentRegistered(node_rank=n, host=f"h{n}", pid=n + 1)).code == 0
        assert len(commits) == N + 1  # every answered event is committed before its answer
        for n in range(N):
            core.dispatch("j", AgentConnected(node_rank=n))
        assert len(commits) == N + 1 and "agent_subscribed" not in kinds(store, "j")
        assert await asyncio.wait_for(_until(lambda: len(commits) == N + 2), 10)  # one batch for all of them
        assert kinds(store, "j").count("agent_subscribed") == N

        core.dispatch("j", AgentDisconnected(node_rank=3))  # soft: waits for the batch...
        assert core.dispatch("j", FaultReported(node_rank=0, faults={0: "1"})).code == 0  # ...or the next commit
        assert len(commits) == N + 3
        tail = kinds(store, "j")[-6:]
        assert tail.index("agent_unsubscribed") < tail.index("fault_reported")  # history keeps its order
        await asyncio.sleep(0.2)
        assert len(commits) == N + 3  # nothing left to flush
        store.close()

    asyncio.run(scenario())


async def _until(cond, timeout: float = 10.0) -> bool:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.01)
    return True


def test_timer_keeps_one_entry_per_job_and_still_fires_when_due(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [100.0]
        store = Store(tmp_path / "state.sqlite3")
        cfg = MachineConfig(agent_loss_timeout=30, agent_loss_grace=30)  # one clock of 30 s, whatever ended it
        core = ControllerCore(cfg, store, SignalHub(), clock=lambda: now[0])
        core.init_job("j", JobInit(node_count=2))
        for n in (0, 1):
            core.dispatch("j", AgentRegistered(node_rank=n, host="h", pid=n + 1))
        for _ in range(300):  # each event moves the job's loss deadline later
            now[0] += 0.01
            core.dispatch("j", AgentConnected(node_rank=0))
            core.dispatch("j", AgentDisconnected(node_rank=0))
        assert len(core._heap) <= 2  # not one entry per event
        core.dispatch("j", AgentConnected(node_rank=1))
        now[0] = 131.0  # past the first deadline pushed (130), before node 0's (103 + 30)
        core.fire_due()
        assert core.jobs["j"].state.value == "RUNNING" and len(core._heap) == 1  # rescheduled, not fired
        now[0] = 134.0
        core.fire_due()
        assert core.jobs["j"].state.value == "FAILED" and "node 0 lost" in core.jobs["j"].info
        core.flush_soft()
        store.close()

    asyncio.run(scenario())
