"""Helpers the controller's unit and e2e tests share: a running job's machine, its due timers fired, a call's
status checked, a job as a restart restores it, what the state file holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from support import ManualClock
from taskd.controller.core import ControllerCore
from taskd.controller.machine.state_machine import AgentConnected, AgentRegistered, JobInit, JobMachine, MachineConfig
from taskd.controller.service.connections import ConnectionWatch, WatchConfig
from taskd.controller.storage.snapshot import snapshot
from taskd.controller.storage.store import JOB_TABLES, Store

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]  # every strategy, in the controller's order
BIG = "x" * 4000  # a text that needs new pages in the events and faults tables
# a round's waits short and each different, so that a test reads which one ran out off the time it fired at
ROUND_CFG = MachineConfig(stop_timeout=10, strategy_timeout=10, recover_timeout=50, resume_timeout=20,
                          agent_loss_timeout=30, agent_loss_grace=5, node_rejoin_timeout=100)


def running_job(nodes: int = 2, per_node: int = 1, cfg: MachineConfig = ROUND_CFG, **init: Any) -> JobMachine:
    """Job "j" RUNNING at t=0: node n's agent h:(100+n) registered with `per_node` ranks and subscribed."""
    m = JobMachine("j", cfg, 0.0, JobInit(node_count=nodes, ranks_per_node=per_node, **init))
    for n in range(nodes):
        assert m.handle(AgentRegistered(node_rank=n, host="h", pid=100 + n, ranks_per_node=per_node), 0.0).code == 0
        m.handle(AgentConnected(node_rank=n, host="h", pid=100 + n), 0.0)
    return m


def connection_watch(table: dict[int, tuple[str, int]], cap: int = 0, fair: Any = None,
                     **cfg: Any) -> tuple[ConnectionWatch, ManualClock, list[set[int]], list[str]]:
    """A ConnectionWatch over `table` ({inode: (ip, port)}, the test's socket table: what it closes leaves it),
    with `cap` and `fair` as the server passes them and `cfg` its WatchConfig; its clock (at 100), the inode sets
    it closed, its notes."""
    clock, closed, notes = ManualClock(100.0), [], []

    def closer(inodes: set[int]) -> int:
        closed.append(set(inodes))
        for i in inodes:
            table.pop(i, None)
        return len(inodes)

    kw = {"fair": fair} if fair is not None else {}
    w = ConnectionWatch(WatchConfig(port=8899, **cfg), note=lambda kind, msg, *a: notes.append(msg % a),
                        clock=clock, table=lambda port: dict(table), closer=closer, cap=cap, **kw)
    return w, clock, closed, notes


def fire(m: JobMachine, t: float) -> list[Any]:
    """Deliver the timer events due at `t`, as the controller's timer does; their outcomes."""
    return [m.handle(ev, t) for ev in m.due_events(t)]


def ok(status) -> None:  # noqa: ANN001 (a proto Status)
    assert status.code == 0, f"{status.code}: {status.info}"


def comparable(snap: dict[str, Any], agents: Any) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """A job as a restart restores it: its snapshot (less the activity stamp, which soft history moves) and
    its agents' identities and finishes."""
    snap = {k: v for k, v in snap.items() if k != "updated_at"}
    return snap, sorted((a.node_rank, a.host, a.pid, a.role, a.finished, a.exit_code) for a in agents)


def memory(core: ControllerCore) -> dict[str, Any]:
    core.flush_soft()
    return {job_id: comparable(snapshot(m, core.clocks.to_wall), m.agents.values()) for job_id, m in core.jobs.items()}


def disk(state: Path) -> dict[str, Any]:
    """What a restarted controller would load (read through a second connection)."""
    store = Store(state)
    try:
        return {snap["job_id"]: comparable(snap, agents) for snap, agents in store.load_jobs()}
    finally:
        store.close()


def kinds(store: Store, job: str) -> list[str]:
    """The kinds of the job's recorded events, oldest first."""
    return [e["kind"] for e in store.events(job, limit=10_000)]


def rows_of(path: Path, job_id: str) -> dict[str, int]:
    """Rows per table for the job, read from the state file by a second connection."""
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE job_id=?", (job_id,)).fetchone()[0]
                for t in JOB_TABLES}
