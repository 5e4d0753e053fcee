"""`taskd migrate --node 1` of a live HSDP job to a standby (issue 34, item 4): one `taskd server`, two `taskd run`
nodes of 2 ranks and a `taskd run --standby`, examples/torch/train_hsdp.py over a 2 x 2 mesh (replicate x shard), one
replica group per node.

At one step boundary node 1's ranks leave and the standby's take their place, receiving their shards (parameters,
optimizer state) from node 0's ranks at the same shard coordinates, in memory. Node 0's ranks keep their processes,
node 1's old agent and ranks exit 0, no step is redone, no round is opened, and each rank's final shards are
bit-identical to a fault-free run's (one node with 4 ranks, run alongside)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import free_port, leftovers, wait_for  # noqa: E402
from support.run import assert_same_shards, computed_steps  # noqa: E402
from test_node_loss_e2e import finish, kill_all, logs, node, server, status  # noqa: E402,F401 (server: a fixture)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
HSDP = ROOT / "examples" / "torch" / "train_hsdp.py"
STEPS = 400  # paced (0.2 s a step: 80 s of room) until the migration is done, then at full speed


def script(out: Path, pace: Path | None) -> list[str]:
    return [str(HSDP), "--steps", str(STEPS), "--replicas", "2", "--hidden", "32", "--pg-timeout", "30",
            "--out", str(out), *(["--step-sleep", "0.2", "--sleep-while", str(pace)] if pace else [])]


def test_migrate_node_1_of_an_hsdp_job_to_a_standby(tmp_path: Path, server: str,  # noqa: F811 (the fixture)
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job, master, out, pace = f"hsdp-move-{os.getpid()}", free_port(), tmp_path / "out", tmp_path / "pace"
    pace.touch()

    def args(rank: int | None) -> list[str]:
        where = ["--standby"] if rank is None else ["--node-rank", str(rank)]
        return ["--nnodes", "2", *where, "--nproc-per-node", "2", "--job-id", job, "--server", server,
                "--master-addr", "127.0.0.1", "--master-port", str(master), "--stop-grace", "2", *script(out, pace)]

    (tmp_path / "reference").mkdir()
    procs = {f"node{r}": node(args(r), tmp_path / f"node{r}.log") for r in range(2)}
    procs["standby"] = node(args(None), tmp_path / "standby.log")
    procs["reference"] = node(["--nproc-per-node", "4", "--quiet", *script(tmp_path / "reference" / "out", None)],
                              tmp_path / "reference.log")
    try:
        wait_for(lambda: all(len(computed_steps(out, r)) >= 3 for r in range(4)), 120, "every rank's first steps")
        wait_for(lambda: "standby for job" in (tmp_path / "standby.log").read_text(), 60, "the standby")
        pids = {r: computed_steps(out, r)[0][2] for r in range(4)}
        moved = subprocess.run([sys.executable, "-m", "taskd", "migrate", "--server", server, "--job", job, "--node",
                                "1", "--timeout", "150"], capture_output=True, text=True, timeout=200, cwd=ROOT)
        text = logs(tmp_path, "node0", "node1", "standby")
        assert moved.returncode == 0, f"{moved}\n{text[-8000:]}"
        assert re.search(r"migrated node 1 of job .* at step \d+: training paused \d+\.\d+s", moved.stdout), moved
        print(moved.stdout.strip())
        pace.unlink()
        codes = finish(procs, tmp_path, timeout=150)
        text = logs(tmp_path, "node0", "node1", "standby")
        assert set(codes.values()) == {0}, (codes, text)  # node 1's old agent too: it ended, not failed
        assert "fault:" not in text and "runs on its successor; this agent ends" in text, text
        for rank in range(4):
            done = computed_steps(out, rank)
            assert [s for s, _, _ in done] == list(range(STEPS)), f"rank {rank} redid or skipped steps\n{text}"
            used = [p for _, _, p in done]
            if rank < 2:  # node 0's ranks kept their processes
                assert set(used) == {pids[rank]}, (rank, pids)
            else:  # node 1's: the old process up to the boundary, the standby's after it
                assert used[0] == pids[rank] and used[-1] != pids[rank] and len(set(used)) == 2, (rank, pids)
            assert_same_shards(out, tmp_path / "reference" / "out", rank)
        record = status(server, job)
        kinds = [e.get("kind") for e in record.get("events", [])]
        assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 0, record
        assert "migrated" in kinds and "round_started" not in kinds, kinds
        wait_for(lambda: leftovers(str(out)) == [], 15, "no process of the job left")
    finally:
        kill_all(list(procs.values()))
