"""The tests of tests/e2e/process/test_pidfd.py that start no process and open no network socket (the
unit tier).

Split from it by move_tests.py; its subject: taskd.process: the one pidfd selector loop (exits,
pipes, wake-ups) with real processes, and its layering.
"""

from __future__ import annotations

import ast
from pathlib import Path


def test_taskd_process_imports_nothing_above_it():
    root = Path(__file__).resolve().parents[3] / "taskd" / "process"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("taskd.") or name.startswith("taskd.process"), f"{path.name}: {name}"


def test_a_ring_wakes_the_agents_wait_and_is_drained(monkeypatch):
    """The doorbell: a rank's `ring_agent` ends the agent's wait at once; once drained, the next wait waits."""
    import os
    import time

    from taskd.process.pidfd import RankWatch
    from taskd.worker.env import Var, ring_agent

    watch = RankWatch(bell=True)
    try:
        assert watch.bell and os.path.exists(watch.bell)
        assert oct(os.stat(os.path.dirname(watch.bell)).st_mode & 0o777) == "0o700"  # only this user rings
        monkeypatch.setenv(Var.TASKD_AGENT_BELL, watch.bell)
        ring_agent()
        ring_agent()  # two rings before the agent looks: one wake-up
        started = time.monotonic()
        assert watch.wait(30.0) == []
        assert time.monotonic() - started < 10.0  # woken, not timed out
        started = time.monotonic()
        assert watch.wait(0.2) == []
        assert time.monotonic() - started >= 0.15  # drained: no busy loop on a stale ring
    finally:
        path = watch.bell
        watch.close()
    assert watch.bell is None and not os.path.exists(os.path.dirname(path))  # nothing left in the temp dir
    ring_agent()  # the agent gone: the rank goes on


def test_ring_agent_outside_taskd_is_a_no_op(monkeypatch):
    from taskd.worker.env import Var, ring_agent

    monkeypatch.delenv(Var.TASKD_AGENT_BELL, raising=False)
    ring_agent()
    monkeypatch.setenv(Var.TASKD_AGENT_BELL, "/nonexistent/taskd-bell")
    ring_agent()  # never raises
