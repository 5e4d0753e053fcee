"""A real rank process continued after SIGSTOP takes no step before its agent's word (issue 31, F1).

The rank writes one byte per step to a counter file; it is SIGSTOPped, then SIGCONTed: it must write
nothing while it waits, ask through its heartbeat file, and go on at once when the agent's answer (given
here as the agent gives it, `HeartbeatFile.answer_continue`) covers the moment it was continued.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from support import STARTED, wait_for

from taskd.worker.heartbeat_file import HeartbeatFile

ROOT = Path(__file__).resolve().parents[3]
RANK = textwrap.dedent("""
    import os, sys, time
    from taskd import worker
    worker.heartbeat(0)
    counter = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for step in range(100000):
        os.write(counter, b".")
        worker.heartbeat(step)
        time.sleep(0.02)
""")


def test_a_continued_rank_writes_nothing_until_its_agent_answers(tmp_path: Path) -> None:
    hb = HeartbeatFile(tmp_path / "rank_0.hb").create()
    counter = tmp_path / "steps"
    env = {**os.environ, "TASKD_HEARTBEAT_FILE": hb.path, "RANK": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(counter)], env=env, cwd=tmp_path)
    STARTED.append(proc)
    try:
        wait_for(lambda: counter.exists() and counter.stat().st_size >= 5, 30, "the rank's first steps")
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        before = counter.stat().st_size
        continued = time.monotonic()
        proc.send_signal(signal.SIGCONT)
        asked = wait_for(hb.continue_asked, 10, "the rank to ask its agent")
        assert asked >= continued  # CLOCK_MONOTONIC: one clock for both processes
        time.sleep(1.0)
        held = counter.stat().st_size - before
        assert held <= 1, f"{held} steps written while waiting for the agent's word"  # <= the write it stopped in
        hb.answer_continue(asked - 1.0)  # an answer older than the stop does not release it
        time.sleep(0.3)
        assert counter.stat().st_size - before == held
        hb.answer_continue(time.monotonic())  # the agent asked the controller after the rank asked
        wait_for(lambda: counter.stat().st_size >= before + held + 5, 10, "the rank to go on")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        hb.close()
