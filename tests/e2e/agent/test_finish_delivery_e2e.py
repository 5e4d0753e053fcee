"""ReportFinished is delivered across a controller restart (issue 17, N1), end to end.

Node 0's ranks finish while the controller is down. Sent once, its finish report was lost: the
restarted controller, after --agent-loss-timeout, counted node 0 as lost and ended node 1's job.
The agent now sends it until the controller acknowledges it, within TASKD_CONTROLLER_TIMEOUT.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import free_port, leftovers, master_args, port_open, wait_for
from support.run import ROOT, taskd_run

# above the agent channel's reconnect backoff (at most 3 s, +20% jitter: client/rpc.py): the restarted controller
# starts its loss clock when it opens the port, and the agent's channel may only try again up to 3.6 s later. At 3 s
# a loaded CI machine saw node 0 declared lost just before its re-sent finish report arrived.
LOSS_TIMEOUT = 8
WAIT_FILE = """
import os, sys, time
path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.05)
"""


def _server(address: str, state: Path, log: Path) -> subprocess.Popen[bytes]:
    port = int(address.rsplit(":", 1)[1])
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", str(state),
                             "--agent-loss-timeout", str(LOSS_TIMEOUT)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT)
    wait_for(lambda: port_open(port), 30, "taskd server to listen")
    return proc


def _agents(address: str, job: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    if out.returncode != 0:
        return []
    jobs = json.loads(out.stdout).get("jobs", [])
    return jobs[0].get("agents", []) if jobs else []


def test_a_node_that_finishes_while_the_controller_is_down_is_finished_not_lost(tmp_path: Path) -> None:
    script = tmp_path / "finish_on_file.py"
    script.write_text(WAIT_FILE)
    address = f"127.0.0.1:{free_port()}"
    state = tmp_path / "ctl.sqlite3"
    server = _server(address, state, tmp_path / "server.log")
    nodes: list[subprocess.Popen[bytes]] = []
    master = master_args()
    try:
        nodes = [taskd_run(["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1", "--job-id", "n1",
                            "--server", address, *master, str(script), str(tmp_path / f"go{r}")],
                           tmp_path / f"node{r}.log",
                           env={"TASKD_CONTROLLER_TIMEOUT": "30"})
                 for r in range(2)]
        wait_for(lambda: len(_agents(address, "n1")) == 2, 60, "both nodes registered")
        wait_for(lambda: "started 1 rank(s)" in (tmp_path / "node0.log").read_text(), 60, "node 0's rank")
        server.kill()
        server.wait(timeout=30)
        (tmp_path / "go0").touch()  # node 0's rank finishes while the controller is down
        # a first attempt failed (after up to 5 s: longer than the old single 3 s one), so the controller is down
        # for longer than that when it comes back
        wait_for(lambda: "finish report not taken" in (tmp_path / "node0.log").read_text(), 30,
                 "node 0 to re-send its finish report")
        server = _server(address, state, tmp_path / "server.log")
        assert nodes[0].wait(timeout=40) == 0, (tmp_path / "node0.log").read_text()
        log0 = (tmp_path / "node0.log").read_text()
        assert "the controller acknowledged this node's finish after" in log0, log0
        finished = wait_for(lambda: [a for a in _agents(address, "n1") if a.get("finished")], 20,
                            "the controller to record node 0's finish")
        assert [a.get("nodeRank", 0) for a in finished] == [0], finished
        (tmp_path / "go1").touch()
        assert nodes[1].wait(timeout=40) == 0, (tmp_path / "node1.log").read_text()
        assert "job succeeded" in (tmp_path / "node1.log").read_text()
        assert leftovers(str(script)) == []
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=10)
        server.kill()
        server.wait(timeout=30)
