"""A failed job's id is refused to its pod started again (issue 32, item 8), end to end.

One `taskd server`, a 2-node job of examples/train_resumable.py. Node 1's whole `taskd run` is SIGKILLed (a
pod OOM-killed: Kubernetes recreates it under the same job id and node rank), nothing replaces it within the
server's --node-rejoin-timeout (2 s here), so the job FAILS and node 0 exits non-zero. Then the recreated pod,
`taskd run --node-rank 1` with the same line, must exit 1 at once with one line naming the job, its failure and
what to do; before, its Init reset the failed job and it waited for node 0 until its join timeout (600 s).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from support import wait_for
from test_node_loss_e2e import example, finish, job_args, kill_all, logs, node, node_loss_server, status


def test_a_recreated_pod_of_a_failed_job_is_refused_in_one_line(tmp_path: Path) -> None:
    with node_loss_server(tmp_path, rejoin_timeout="2") as server:
        procs = {f"node{r}": node([*job_args(server, "gone", r), *example(tmp_path)], tmp_path / f"node{r}.log")
                 for r in range(2)}
        try:
            wait_for(lambda: all((tmp_path / "ckpt" / f"rank{r}").is_dir() for r in range(4)), 60, "every checkpoint")
            os.killpg(procs["node1"].pid, signal.SIGKILL)  # the pod's taskd run OOM-killed: exit 137
            assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
            codes = finish({"node0": procs["node0"]}, tmp_path, timeout=60)
            assert codes["node0"] not in (0, 137), logs(tmp_path, "node0")
            failed = status(server, "gone")
            assert failed.get("state") == "FAILED", failed
            started = time.monotonic()
            procs["recreated"] = node([*job_args(server, "gone", 1), *example(tmp_path)], tmp_path / "recreated.log")
            codes = finish({"recreated": procs["recreated"]}, tmp_path, timeout=30)
            took = time.monotonic() - started
            text = (tmp_path / "recreated.log").read_text()
            assert codes["recreated"] == 1, text  # examples/k8s: not 0 or 137, so the Job fails (no retry)
            assert "job gone FAILED (" in text and "Start the whole job under a new job id" in text, text
            assert "waiting for nodes" not in text, text  # it no longer waits for node 0
            record = status(server, "gone")
            assert record.get("state") == "FAILED" and record.get("info") == failed.get("info"), record
            assert [e for e in record.get("events", []) if e.get("kind") == "rerun_refused"], record
            print(f"recreated pod refused in {took:.1f}s")
        finally:
            kill_all(list(procs.values()))
