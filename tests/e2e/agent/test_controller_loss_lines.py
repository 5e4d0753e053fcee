"""What an agent says, and what the controller counts, when its `taskd server` is SIGKILLed (issue 31).

F11: every agent printed the set-up hint of a connection that never worked ("a controller that serves TLS
..., one at a connection limit ..., or not a taskd controller at all") when the controller it had been
talking to was killed; it now says "the controller at ADDR closed the connection ...; retrying".
F13: a restart the agent made alone (degraded: its fault report not taken while the controller was down) was
not counted by the controller once it came back (the agent said "restart 1 of 3", `taskd status` 0/3).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support import STARTED, free_port, port_open, wait_for
from support.run import ROOT, taskd_run
from support.scripted_agent import ScriptedAgent

SETUP_HINTS = ("TASKD_TLS_CA", "connection limit", "not a taskd controller")


@contextmanager
def controller(state: str, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state",
                             state], stdout=subprocess.DEVNULL, stderr=log.open("ab"), cwd=ROOT)
    STARTED.append(proc)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "taskd server to listen")
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_a_killed_controller_is_said_to_be_gone_not_misconfigured(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(60)\n")
    agent = None
    try:
        with controller(":memory:", port, tmp_path / "server.log") as server:
            agent = taskd_run(["--job-id", "gone", "--server", f"127.0.0.1:{port}", str(script)], tmp_path / "a.log",
                              env={"TASKD_CONTROLLER_TIMEOUT": "3"})
            wait_for(lambda: "started 1 rank(s)" in (tmp_path / "a.log").read_text(), 60, "the rank to start")
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=10)
            wait_for(lambda: "retrying" in (tmp_path / "a.log").read_text(), 30, "the agent to notice")
        text = (tmp_path / "a.log").read_text()
        assert f"the controller at 127.0.0.1:{port} closed the connection" in text, text
        assert not [hint for hint in SETUP_HINTS if hint in text], text
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=30)


CRASH_ONCE = """
import os, sys, time
from pathlib import Path
state = Path(sys.argv[1])
if not (state / "crashed").exists():
    while not (state / "go").exists():
        time.sleep(0.05)
    (state / "crashed").touch()
    sys.exit(1)
while not (state / "done").exists():
    time.sleep(0.05)
"""


def test_a_degraded_restart_is_counted_by_the_controller_once_it_is_back(tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "ctl.sqlite3"
    script = tmp_path / "crash_once.py"
    script.write_text(CRASH_ONCE)
    log = tmp_path / "agent.log"
    agent = None

    def restarts() -> int | None:
        jobs = ScriptedAgent(f"127.0.0.1:{port}", "x").list_jobs("deg").jobs
        return jobs[0].restarts if jobs else None

    try:
        with controller(str(state), port, tmp_path / "server.log") as server:
            agent = taskd_run(["--job-id", "deg", "--server", f"127.0.0.1:{port}", "--max-restarts", "3", str(script),
                               str(tmp_path)], log, env={"TASKD_CONTROLLER_TIMEOUT": "3"})
            wait_for(lambda: "started 1 rank(s)" in log.read_text(), 60, "the rank to start")
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=10)
        (tmp_path / "go").touch()  # the rank crashes while no controller can take the fault report
        wait_for(lambda: "degraded: local job-rescheduling (restart 1 of 3)" in log.read_text(), 60, "a restart")
        with controller(str(state), port, tmp_path / "server.log"):
            wait_for(lambda: restarts() == 1, 60, "the controller to count the agent's restart")
            (tmp_path / "done").touch()
            assert agent.wait(timeout=60) == 0, log.read_text()
            job = ScriptedAgent(f"127.0.0.1:{port}", "x").list_jobs("deg").jobs[0]
            assert (job.state, job.restarts, job.maxRestarts) == ("SUCCEEDED", 1, 3), job
            assert "restarts_reported" in [e.kind for e in job.events]
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
