"""Helpers the controller's unit and e2e tests share: a call's status checked, a job as a restart restores it,
what the state file holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from taskd.controller.core import ControllerCore
from taskd.controller.snapshot import snapshot
from taskd.controller.store import JOB_TABLES, Store

ALL = ["retry", "recover", "job-rescheduling", "dump", "exit"]  # every strategy, in the controller's order
BIG = "x" * 4000  # a text that needs new pages in the events and faults tables


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
