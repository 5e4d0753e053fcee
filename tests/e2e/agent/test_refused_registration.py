"""An agent the controller refuses says why and exits 1 (it said "none answered", naming no refusal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import STARTED, free_port, port_open, wait_for
from support.run import ROOT, taskd_run


def test_a_standby_over_the_controllers_bound_exits_1_with_the_controllers_reason(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state",
                               ":memory:", "--max-standbys", "0"], stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "server.log").open("wb"), cwd=ROOT)
    STARTED.append(server)
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        script = tmp_path / "never.py"
        script.write_text("raise SystemExit('a standby must not start a rank')\n")
        standby = taskd_run(["--standby", "--nnodes", "2", "--nproc-per-node", "1", "--job-id", "bounded",
                             "--server", f"127.0.0.1:{port}", str(script)], tmp_path / "standby.log")
        assert standby.wait(timeout=60) == 1
        log = (tmp_path / "standby.log").read_text()
        assert "the controller refused this standby: 409" in log and "--max-standbys" in log, log
        assert "none answered" not in log and "must not start a rank" not in log, log
    finally:
        server.terminate()
        server.wait(timeout=30)
