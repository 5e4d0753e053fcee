"""A lost `taskd run` end to end: a real `taskd server`, two real nodes, one SIGKILLed.

Node 1's ranks die with their agent (PDEATHSIG). Since issue 17 the controller does not fail the job at once:
it opens a node-loss round and waits `--node-rejoin-timeout` for a replacement of node 1; none comes here, so
the job fails and node 0 stops its ranks and exits non-zero instead of running (or, in a coupled job, hanging)
forever, with a reason that says how to add a node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support import free_port, leftovers, master_args, port_open, ranks_of, wait_for
from support.run import ROOT, taskd_run

LOSS_TIMEOUT = 3
REJOIN_TIMEOUT = 3



def test_sigkilled_node_without_replacement_fails_the_job_and_the_other_node_exits(tmp_path: Path) -> None:
    marker = f"lost-node-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text("import time\ntime.sleep(120)\n")
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", ":memory:",
                               "--agent-loss-timeout", str(LOSS_TIMEOUT), "--node-rejoin-timeout", str(REJOIN_TIMEOUT)],
                              stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    nodes: list[subprocess.Popen[bytes]] = []
    master = master_args()
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        nodes = [
            taskd_run(["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "2", "--job-id", "lost-node",
                       "--server", address, "--stop-grace", "2", *master, str(script)], tmp_path / f"node{r}.log")
            for r in range(2)
        ]
        for r, node in enumerate(nodes):
            wait_for(lambda node=node: len(ranks_of(node.pid)) == 2, 60, f"node {r}'s 2 ranks")
        node1_ranks = list(ranks_of(nodes[1].pid).values())
        node0_ranks = list(ranks_of(nodes[0].pid).values())

        nodes[1].kill()
        nodes[1].wait(timeout=10)
        wait_for(lambda: not any(pid in leftovers(marker) for pid in node1_ranks), 10,
                 "node 1's ranks to die with their agent")

        # the loss timeout plus a generous margin for a loaded machine: bounded, not a timing assertion
        code = nodes[0].wait(timeout=LOSS_TIMEOUT + REJOIN_TIMEOUT + 60)
        log0 = (tmp_path / "node0.log").read_text()
        assert code != 0, log0
        assert "job FAILED (the controller chose exit: node(s) 1 lost and no replacement joined" in log0, log0
        assert "taskd run --node-rank 1" in log0, log0
        wait_for(lambda: leftovers(marker) == [], 10, "no rank process of the job left")
        assert not any(pid in leftovers(marker) for pid in node0_ranks)

        status = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", "lost-node",
                                 "--json"], capture_output=True, text=True, timeout=30, cwd=ROOT)
        assert status.returncode == 0, status.stderr
        job = json.loads(status.stdout)["jobs"][0]
        assert job["state"] == "FAILED", job
        assert "node(s) 1 lost and no replacement joined" in job["info"], job["info"]
        lost = [e for e in job["events"] if e["kind"] == "node_lost"]
        assert len(lost) == 1 and lost[0]["detail"]["node_rank"] == 1, lost
        assert lost[0]["detail"]["seconds"] >= LOSS_TIMEOUT
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=10)
        server.terminate()
        server.wait(timeout=30)


CRASH_ONCE = """
import os, sys, time
marker = sys.argv[1]
if os.environ["LOCAL_RANK"] == "1" and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(1)
    sys.exit(1)  # a fault, once
time.sleep(2)
"""


def test_a_controller_lost_in_the_middle_of_a_recovery_does_not_strand_the_agent(tmp_path: Path) -> None:
    """The round waits for node 0 (which never answers) when the controller dies: nothing would ever send
    node 1 its next signal. After TASKD_CONTROLLER_TIMEOUT node 1 stops its ranks and exits non-zero with
    the reason: degraded mode is off for multi-node jobs (issue 11 M3), since a node restarting its ranks
    alone would split the job, its peers keeping their old incarnation."""
    from support.scripted_agent import ScriptedAgent

    script = tmp_path / "crash_once.py"
    script.write_text(CRASH_ONCE)
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", address, "--state", ":memory:"],
                              stdout=(tmp_path / "server.log").open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    node1 = None
    try:
        wait_for(lambda: port_open(port), 30, "taskd server to listen")
        node0 = ScriptedAgent(address, "lost-controller", 0, 2, 2).join()  # never answers stopTrain
        node1 = taskd_run(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--job-id",
                           "lost-controller", "--server", address, *master_args(), str(script),
                           str(tmp_path / "crashed")],
                          tmp_path / "node1.log", env={"TASKD_CONTROLLER_TIMEOUT": "2"})
        node0.expect("stopTrain", timeout=60)  # rank 3 crashed: the round is open, waiting for node 0
        server.kill()
        server.wait(timeout=30)
        node0.close()
        assert node1.wait(timeout=90) == 1, (tmp_path / "node1.log").read_text()  # rank 3's exit code
        log1 = (tmp_path / "node1.log").read_text()
        assert "controller lost for" in log1 and "in the middle of a recovery" in log1, log1
        assert "cannot recover without its controller; stopping every rank" in log1, log1
        assert "no recovery without the controller for a multi-node job" in log1, log1  # the summary's reason
        assert "degraded mode" not in log1 and "replaced rank" not in log1, log1
        assert leftovers(str(script)) == []
    finally:
        if node1 is not None and node1.poll() is None:
            node1.kill()
            node1.wait(timeout=10)
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def test_a_multi_node_job_without_a_controller_stops_before_starting_ranks(tmp_path: Path) -> None:
    """Degraded mode is off for multi-node jobs from the start too: no controller within
    TASKD_CONTROLLER_TIMEOUT, no rank started, exit 1 with the reason."""
    marker = f"no-controller-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    started = tmp_path / "started"
    script.write_text(f"open({str(started)!r}, 'a').close()\nimport time\ntime.sleep(60)\n")
    node = taskd_run(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--job-id", "no-controller",
                      "--server", f"127.0.0.1:{free_port()}", *master_args(), str(script)],
                     tmp_path / "node1.log",
                     env={"TASKD_CONTROLLER_TIMEOUT": "1"})
    try:
        assert node.wait(timeout=60) == 1, (tmp_path / "node1.log").read_text()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(timeout=10)
    log1 = (tmp_path / "node1.log").read_text()
    assert "a job of 2 nodes does not run without one" in log1, log1
    assert not started.exists(), "a rank started although the job had no controller"
    assert leftovers(str(script)) == []
