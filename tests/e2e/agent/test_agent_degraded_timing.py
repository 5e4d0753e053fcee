"""Degraded mode starts at TASKD_CONTROLLER_TIMEOUT, measured end to end (issue 16 item 4).

A real `taskd server` is SIGKILLed under a running one-node `taskd run`; nobody listens on its port any more.
A rank then crashes: the agent's fault report is a pending item its loop polls (agent/link/reports.py), so the
agent goes degraded when the timeout has passed, not after a blocking client retry on top of its own (the
agent took 10.0 s for a 5 s timeout before, 51.7 s for 30 s), and a rank that finishes meanwhile is
logged when it finishes. With nobody listening from the start, the agent runs degraded after the timeout too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from support import free_port, leftovers, port_open, wait_for
from support.run import ROOT, taskd_run

TIMEOUT = 5.0  # TASKD_CONTROLLER_TIMEOUT: short to keep the test fast; the bound below tracks it
SLACK = 3.0

SCRIPT = '''
import os, sys, time
from pathlib import Path
state = Path(sys.argv[1])
rank = os.environ["LOCAL_RANK"]
if (state / "crashed").exists():
    sys.exit(0)  # after the degraded restart: done
(state / f"started-{rank}").touch()
while not (state / "go").exists():
    time.sleep(0.01)
if rank == "1":
    (state / "crashed").touch()
    sys.exit(1)
time.sleep(1.0)  # rank 0 finishes while the fault report waits for a controller that is gone
'''


def test_degraded_mode_starts_at_the_controller_timeout_after_the_controller_died(tmp_path: Path) -> None:
    script, state = tmp_path / "crash_once.py", tmp_path / "state"
    script.write_text(SCRIPT)
    state.mkdir()
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", ":memory:"],
                              stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    console = tmp_path / "console.log"
    proc = None
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        proc = taskd_run(["--nproc-per-node", "2", "--server", address, "--job-id", "degraded-timing", str(script),
                          str(state)], console, env={"TASKD_CONTROLLER_TIMEOUT": str(TIMEOUT)})
        wait_for(lambda: (state / "started-0").exists() and (state / "started-1").exists(), 60, "both ranks")
        server.kill()
        server.wait(timeout=30)
        (state / "go").touch()
        crashed = wait_for(lambda: (state / "crashed").exists() and time.time(), 30, "rank 1 to crash")
        wait_for(lambda: "degraded mode" in console.read_text(errors="replace"), TIMEOUT + 30, "degraded mode")
        seen = time.time() - crashed
        assert proc.wait(timeout=60) == 0, console.read_text(errors="replace")
    finally:
        for p in (proc, server):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    text = console.read_text(errors="replace")
    # the agent's own figure: fault -> every rank restarted, which includes the wait for the controller
    restarted = float(re.search(r"replaced rank\(s\) \[1\] with job-rescheduling .*\(degraded: no controller\) "
                                r"in ([0-9.]+)s", text).group(1))
    assert TIMEOUT <= restarted <= TIMEOUT + SLACK, f"degraded after {restarted:.2f}s, timeout {TIMEOUT}s\n{text}"
    assert seen <= TIMEOUT + SLACK + 1.0, f"the test saw degraded mode {seen:.2f}s after the crash\n{text}"
    assert f"the controller did not take the fault report for {TIMEOUT:.0f}s (unreachable or failing)" in text
    lines = text.splitlines()
    finished = next(i for i, line in enumerate(lines) if re.search(r"rank 0 \(pid \d+\) finished", line))
    degraded = next(i for i, line in enumerate(lines) if "degraded mode" in line)
    assert finished < degraded, f"rank 0's end was logged only after the report gave up\n{text}"
    assert leftovers(str(script)) == []


def test_with_nobody_listening_the_agent_runs_degraded_after_the_controller_timeout(tmp_path: Path) -> None:
    script, state = tmp_path / "crash_once.py", tmp_path / "state"
    script.write_text(SCRIPT)
    state.mkdir()
    (state / "crashed").touch()  # the ranks just finish
    console = tmp_path / "console.log"
    # what the end-to-end figure below includes besides the timeout: an interpreter and taskd.run's imports,
    # measured now (11.2 s against a fixed 9 s bound at load average 23)
    begun = time.monotonic()
    subprocess.run([sys.executable, "-c", "import taskd.run"], cwd=ROOT, check=True, timeout=60)
    startup = time.monotonic() - begun
    started = time.monotonic()
    proc = taskd_run(["--nproc-per-node", "1", "--server", f"127.0.0.1:{free_port()}", "--job-id", "nobody",
                      str(script), str(state)], console, env={"TASKD_CONTROLLER_TIMEOUT": str(TIMEOUT)})
    try:
        wait_for(lambda: "running degraded" in console.read_text(errors="replace"), TIMEOUT + 30, "degraded")
        seen = time.monotonic() - started
        assert proc.wait(timeout=60) == 0, console.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = console.read_text(errors="replace")
    said = re.search(r"Init failed \d+ times in ([0-9.]+)s", text)  # the agent's own clock: no start-up in it
    assert said and TIMEOUT <= float(said.group(1)) <= TIMEOUT + SLACK, text
    assert TIMEOUT <= seen <= TIMEOUT + SLACK + 2 * startup + 0.5, (
        f"degraded {seen:.2f}s after the start ({startup:.2f}s to start an interpreter and import taskd.run)\n{text}")
