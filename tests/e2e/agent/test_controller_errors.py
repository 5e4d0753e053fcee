"""An agent whose controller fails inside (issue 11 item 5): retry, then degraded mode, never a killed job.

A real controller runs in this process with a real state file. Once the job runs, the descriptor of its
SQLite write-ahead log is swapped for a read-only one: every later write fails with EBADF, which SQLite
reports as "disk I/O error", so the controller can answer the agent's fault report only with an error.
A real `taskd run` (one node, two ranks) then sees a rank crash: it must retry the report for
TASKD_CONTROLLER_TIMEOUT, go degraded, restart its ranks locally and finish the job with exit 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import leftovers, wait_for
from support.run import taskd_run

from taskd.controller.service.server import ControllerConfig, EmbeddedController

SCRIPT = '''
import os, sys, time
from pathlib import Path
state = Path(sys.argv[1])
rank = os.environ["RANK"]
crashed = state / "crashed"
if not crashed.exists():
    (state / f"started-{rank}").touch()
    deadline = time.time() + 60
    while not (state / "go").exists() and time.time() < deadline:
        time.sleep(0.05)
    if rank == "1":
        crashed.touch()
        sys.exit(1)  # a fault the controller cannot store
    time.sleep(60)  # rank 0 waits to be restarted with the job
(state / f"done-{rank}-{os.getpid()}").touch()
'''


def break_wal(state_file: Path) -> int:
    """Swap every descriptor this process holds on the state file's -wal for a read-only one; how many."""
    wal = f"{state_file}-wal"
    swapped = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target == wal:
            ro = os.open(wal, os.O_RDONLY)
            os.dup2(ro, int(name))
            os.close(ro)
            swapped += 1
    return swapped


@pytest.mark.timeout(120)
def test_agent_degrades_when_the_controller_answers_store_errors(tmp_path: Path) -> None:
    state_file = tmp_path / "controller.sqlite3"
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=str(state_file)))
    address = ctl.start()
    script, state = tmp_path / "crash_once.py", tmp_path / "state"
    script.write_text(SCRIPT)
    state.mkdir()
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "2", "--max-restarts", "2", "--server", address, "--job-id",
                      "store-fails", str(script), str(state)], console, env={"TASKD_CONTROLLER_TIMEOUT": "2"})
    try:
        wait_for(lambda: (state / "started-0").exists() and (state / "started-1").exists(), 60,
                 "both ranks to start")
        assert break_wal(state_file) >= 1, "the controller holds no write-ahead log to break"
        (state / "go").touch()
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        ctl.stop()
    text = console.read_text(errors="replace")
    assert rc == 0, f"taskd run exited {rc}: a controller error must not kill the job\n{text}"
    assert "fault report not taken" in text or "to the fault report" in text, f"the report did not fail\n{text}"
    assert "the controller did not take the fault report for 2s (unreachable or failing): degraded mode" in text, text
    assert "agent failed" not in text and "Traceback" not in text, text
    assert len(list(state.glob("done-*"))) == 2, f"both restarted ranks should finish\n{text}"
    assert leftovers(str(script)) == []
