"""Planned migration on the controller (`taskd migrate`, docs/controller.md "Planned migration"): the request
checked against the job and handed to the agent that holds the rank, and that agent's account recorded.

The agent does the migration (taskd/agent/ranks/migration.py); the controller only decides whether to ask, names the
generation (the job's signal number, like a round's) and keeps the outcome in the job's events. Nothing here
changes the job's state: a migration is no round and charges no restart.
"""

from __future__ import annotations

import asyncio

from taskd.controller.machine.events import MigrationReported, MigrationRequested, Outcome
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import JobState
from taskd.controller.nodes import node_migration
from taskd.vocabulary import STRAGGLER_MIGRATION, Code, SignalType


def refusal(m: Job, rank: int) -> tuple[int, str]:
    """(0, "") when the controller may ask for ``rank``'s migration, else (code, why); pure."""
    if m.state is not JobState.RUNNING:
        return Code.OUT_OF_ORDER, f"job {m.job_id} is {m.state.value}, not RUNNING: a migration needs a running job"
    per_node = m.ranks_per_node
    if per_node <= 0:
        return Code.OUT_OF_ORDER, f"job {m.job_id}'s agents did not say how many ranks they run"
    world = m.node_count * per_node
    if not 0 <= rank < world:
        return Code.INVALID_PARAMS, f"rank {rank} is not a rank of job {m.job_id} (0..{world - 1})"
    if m.node_count > 1:
        return Code.OUT_OF_ORDER, (f"job {m.job_id} runs on {m.node_count} nodes: planned migration is built for "
                                   "one-node jobs so far (every node would have to re-form the group together)")
    agent = m.agents.get(rank // per_node)
    if agent is None or not agent.subscribed or agent.finished:
        return Code.OUT_OF_ORDER, f"the agent of node {rank // per_node} is not connected: nobody to move rank {rank}"
    return 0, ""


def on_migrate(m: Job, ev: MigrationRequested, now: float, out: Outcome) -> JobState:
    """Ask the rank's agent (`taskd.migrate`, extraParams rank and generation); refused: nothing is sent. A node's
    migration is nodes/node_migration.py's."""
    if ev.node is not None:
        return node_migration.on_migrate(m, ev, now, out)
    code, why = refusal(m, ev.rank)
    if code:
        out.code, out.info = code, why
        return m.state
    node = ev.rank // m.ranks_per_node
    sig = m.signal(SignalType.MIGRATE, (), nodes=(node,), keep=False,
                   extra=(("rank", ev.rank), ("generation", m.signal_seq + 1)))
    out.signals.append(sig)
    out.info = sig.uuid  # what the caller waits on: the agent's report names it
    m.record(out, "migration_requested", rank=ev.rank, node_rank=node, generation=sig.generation, migration=sig.uuid)
    return m.state


def on_migrated(m: Job, ev: MigrationReported, now: float, out: Outcome) -> JobState:
    """Record the agent's account as one job event (`migrated` or `migration_failed`), with what asked for it
    (`trigger`: `taskd migrate`, or `straggler` for one its agent started itself, `--migrate-stragglers`). A node
    migration's stages are nodes/node_migration.py's."""
    if ev.stage or (m.node_move is not None and ev.migration == m.node_move.migration):
        return node_migration.on_report(m, ev, now, out)
    out.settled = ev
    trigger = "straggler" if ev.migration.startswith(STRAGGLER_MIGRATION) else "taskd migrate"
    detail: dict[str, object] = {"rank": ev.rank, "node_rank": ev.node_rank, "migration": ev.migration,
                                 "generation": ev.generation, "trigger": trigger}
    if ev.migrated:
        detail.update(old_pid=ev.old_pid, new_pid=ev.new_pid, step=ev.step, pause_seconds=round(ev.pause_seconds, 6),
                      resumed_seconds=round(ev.resumed_seconds, 6))
    else:
        detail["reason"] = ev.reason
    m.record(out, "migrated" if ev.migrated else "migration_failed", **detail)
    return m.state


class MigrationWaits:
    """The `Migrate` calls waiting for their agent's report, by migration (the signal's uuid); event-loop only."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[MigrationReported]] = {}

    def expect(self, migration: str) -> asyncio.Future[MigrationReported]:
        future: asyncio.Future[MigrationReported] = asyncio.get_running_loop().create_future()
        self._waiting[migration] = future
        return future

    def forget(self, migration: str) -> None:
        self._waiting.pop(migration, None)

    def settle(self, report: MigrationReported) -> None:
        future = self._waiting.pop(report.migration, None)
        if future is not None and not future.done():
            future.set_result(report)


__all__ = ["MigrationReported", "MigrationRequested", "MigrationWaits", "on_migrate", "on_migrated", "refusal"]
