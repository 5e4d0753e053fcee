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


def test_a_ring_wakes_the_agents_wait_and_is_drained(monkeypatch, tmp_path):
    """The doorbell: a rank's `ring_agent` ends the agent's wait at once; once drained, the next wait waits."""
    import time

    from taskd.process.pidfd import RankWatch
    from taskd.worker.env import Var, ring_agent

    watch = RankWatch()
    try:
        assert watch.open_bell(str(tmp_path)) == watch.bell == str(tmp_path / "agent.bell")
        assert watch.open_bell(str(tmp_path)) == watch.bell  # once
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
        watch.close()
    assert watch.bell is None and list(tmp_path.iterdir()) == []  # the socket removed with it
    ring_agent()  # the agent gone: the rank goes on


def test_a_doorbell_that_cannot_be_made_says_none(tmp_path):
    from taskd.process.pidfd import RankWatch

    watch = RankWatch()
    try:
        assert watch.open_bell(str(tmp_path / ("x" * 120))) is None and watch.bell is None  # past a socket name's limit
    finally:
        watch.close()


def test_ring_agent_outside_taskd_is_a_no_op(monkeypatch):
    from taskd.worker.env import Var, ring_agent

    monkeypatch.delenv(Var.TASKD_AGENT_BELL, raising=False)
    ring_agent()
    monkeypatch.setenv(Var.TASKD_AGENT_BELL, "/nonexistent/taskd-bell")
    ring_agent()  # never raises


def test_a_doorbell_left_by_a_killed_agent_is_replaced_and_a_live_one_kept(tmp_path):
    import socket

    from taskd.process.pidfd import RankWatch

    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "agent.bell"))
    dead.close()  # its file stays, as after a SIGKILL
    first = RankWatch()
    try:
        assert first.open_bell(str(tmp_path)) == str(tmp_path / "agent.bell")
        second = RankWatch()
        try:
            assert second.open_bell(str(tmp_path)) is None  # the first agent's bell is alive: not taken
        finally:
            second.close()
        assert (tmp_path / "agent.bell").exists()
    finally:
        first.close()
