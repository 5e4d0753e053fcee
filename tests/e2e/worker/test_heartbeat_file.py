"""HeartbeatFile.read() when a rank died in the middle of a write (odd sequence counter).

One test forges the torn state byte by byte; the other gets it the real way, by SIGKILLing a
rank that beats in a tight loop, and checks whatever state the kill left.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
from support.worker import seq_of

from taskd.worker.heartbeat_file import HeartbeatFile

WAIT = 20.0  # generous: the suite must pass on a loaded 2-core machine


BEATER = """
import sys
from taskd import worker
worker.heartbeat(0)
sys.stdout.write("ready\\n")
sys.stdout.flush()
step = 0
while True:
    step += 1
    worker.heartbeat(step)
"""


def start_beater(path) -> subprocess.Popen:
    env = dict(os.environ, TASKD_HEARTBEAT_FILE=str(path), TASKD_STACK_SIGNAL="0")
    env.pop("TASKD_HEARTBEAT_DIR", None)
    proc = subprocess.Popen([sys.executable, "-c", BEATER], env=env, stdout=subprocess.PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], WAIT)
    if not ready or proc.stdout.readline() != b"ready\n":
        proc.kill()
        proc.wait(WAIT)
        pytest.fail("the beating rank did not start")
    return proc


def test_rank_sigkilled_in_a_tight_write_loop(tmp_path):
    """Whatever instant the kill lands at, read() answers and never passes off torn bytes.

    Kills until one lands mid-write (about a third of them do), so the torn path is always exercised.
    """
    path = tmp_path / "rank_0.hb"
    torn_seen = consistent_seen = 0
    for attempt in range(60):
        if torn_seen and attempt >= 4:
            break
        HeartbeatFile(path).create()
        reader = HeartbeatFile(path).open()
        proc = start_beater(path)
        try:
            # a reader racing a writer that never pauses may itself find every try mid-write (torn, and
            # with no earlier snapshot): retry until it holds one consistent beat of this rank
            deadline = time.monotonic() + WAIT
            before = reader.read()
            while (before.torn or before.pid != proc.pid) and time.monotonic() < deadline:
                time.sleep(0.001)
                before = reader.read()
            assert before.pid == proc.pid and not before.torn
            time.sleep(0.01 * (attempt % 4))  # land the kill at different points of the loop
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(WAIT)
        state = reader.read()
        if seq_of(path) % 2:
            torn_seen += 1
            assert state.torn
            # the last consistent snapshot this reader saw, not the half-written beat
            assert state._replace(torn=False) == before
        else:
            consistent_seen += 1
            assert not state.torn
            assert state.pid == proc.pid and state.step is not None and state.beats >= before.beats
        reader.close()
    assert torn_seen, f"no kill out of {consistent_seen} landed mid-write"
