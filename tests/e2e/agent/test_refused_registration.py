"""An agent the controller refuses says why and exits 1 (it said "none answered", naming no refusal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import STARTED, free_port, master_args, port_open, wait_for
from support.run import ROOT, taskd_run


def test_a_standby_over_the_controllers_bound_exits_1_with_the_controllers_reason(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state",
                               ":memory:", "--max-standbys", "0"], stdout=subprocess.DEVNULL,
                              stderr=(tmp_path / "server.log").open("wb"), cwd=ROOT)
    STARTED.append(server)
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        master = master_args()
        script = tmp_path / "never.py"
        script.write_text("raise SystemExit('a standby must not start a rank')\n")
        standby = taskd_run(["--standby", "--nnodes", "2", "--nproc-per-node", "1", "--job-id", "bounded",
                             "--server", f"127.0.0.1:{port}", *master, str(script)], tmp_path / "standby.log")
        assert standby.wait(timeout=60) == 1
        log = (tmp_path / "standby.log").read_text()
        assert "the controller refused this standby: 409" in log and "--max-standbys" in log, log
        assert "none answered" not in log and "must not start a rank" not in log, log
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_node_started_with_another_nproc_per_node_exits_1_saying_so(tmp_path: Path) -> None:
    """Issue 31, F6: node 1 started with --nproc-per-node 3 for a job whose node 0 runs 2 ranks joined silently,
    its ranks overlapping node 0's in `taskd status`."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state",
                               ":memory:"], stdout=subprocess.DEVNULL, stderr=(tmp_path / "server.log").open("wb"),
                              cwd=ROOT)
    STARTED.append(server)
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(60)\n")
    common = ["--nnodes", "2", "--job-id", "mixed", "--server", f"127.0.0.1:{port}", "--rdzv-conf", "join_timeout=60",
              *master_args()]
    node0 = None
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        node0 = taskd_run([*common, "--node-rank", "0", "--nproc-per-node", "2", str(script)], tmp_path / "node0.log")
        wait_for(lambda: "node 0 of 2" in (tmp_path / "node0.log").read_text(), 60, "node 0 to join")
        node1 = taskd_run([*common, "--node-rank", "1", "--nproc-per-node", "3", str(script)], tmp_path / "node1.log")
        assert node1.wait(timeout=60) == 1
        log = (tmp_path / "node1.log").read_text()
        assert "the controller refused this node: 409 node 1 says it runs 3 rank(s) per node, but job mixed has 2" \
               in log, log
        assert "--nproc-per-node 2" in log and "none answered" not in log, log
    finally:
        if node0 is not None:
            node0.terminate()
            node0.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)
