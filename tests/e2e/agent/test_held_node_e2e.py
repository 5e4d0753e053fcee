"""A node rank given to two live agents (issue 17, agent/link/registration.py): the second is refused, waits (twice
TASKD_CONTROLLER_TIMEOUT) for a loss of the first that never comes, and exits 1 saying so. It does not become a
standby (only an agent whose node a replacement holds does: test_node_loss_e2e's standby test) and leaves the job
and its node 1 as they were."""

from __future__ import annotations

import signal
from pathlib import Path

from support import wait_for
from test_node_loss_e2e import job_args, kill_all, logs, node, node_loss_server, status


def test_a_second_live_agent_for_a_node_rank_exits_1_and_the_first_keeps_it(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with node_loss_server(tmp_path) as server:
        procs = {f"node{r}": node([*job_args(server, "twin", r), str(script)], tmp_path / f"node{r}.log")
                 for r in range(2)}
        try:
            wait_for(lambda: len([a for a in status(server, "twin").get("agents", []) if a.get("subscribed")]) == 2,
                     30, "both nodes to subscribe")
            twin = node([*job_args(server, "twin", 1), str(script)], tmp_path / "twin.log",
                        TASKD_CONTROLLER_TIMEOUT="1")
            assert twin.wait(timeout=30) == 1, logs(tmp_path, "twin")
            text = logs(tmp_path, "twin")
            assert "the controller refused this node: 409" in text and "is held by a live agent" in text, text
            assert "given to two agents" in text and "waiting up to 2s" in text, text
            assert "standby" not in text, text
            record = status(server, "twin")
            assert record.get("state") == "RUNNING", record
            holder = [a for a in record.get("agents", []) if a.get("nodeRank", 0) == 1 and not a.get("standby")]
            assert [a.get("pid") for a in holder] == [procs["node1"].pid], record
            assert all(p.poll() is None for p in procs.values()), logs(tmp_path, "node0", "node1")
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            for p in procs.values():
                p.wait(timeout=30)
        finally:
            kill_all(list(procs.values()))
