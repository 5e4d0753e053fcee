"""A lost node of a live HSDP job is recovered live onto a standby (issue 34, item 3): one `taskd server`, two
`taskd run` nodes of 2 ranks and a `taskd run --standby`, examples/torch/train_hsdp.py over a 2 x 2 mesh
(replicate x shard), one replica group per node.

Node 1's whole `taskd run` (agent and ranks) is SIGKILLed mid-training. Node 0's ranks keep their processes and
their shards; the standby takes node 1 over, and its ranks receive their shards (parameters, optimizer state)
from node 0's ranks at the same shard coordinates, in memory. No step is redone and the final shards are
bit-identical to a fault-free run's (one node with 4 ranks, run alongside)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import free_port, leftovers, wait_for  # noqa: E402
from support.run import assert_same_shards, computed_steps  # noqa: E402
from test_node_loss_e2e import finish, kill_all, logs, node, server, status  # noqa: E402,F401 (server: a fixture)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
HSDP = ROOT / "examples" / "torch" / "train_hsdp.py"
STEPS, KILL_AT = 12, 4  # node 1 is killed once every rank completed KILL_AT steps


def script(out: Path, sleep: float) -> list[str]:
    return [str(HSDP), "--steps", str(STEPS), "--replicas", "2", "--hidden", "32", "--pg-timeout", "30",
            "--out", str(out), "--step-sleep", str(sleep)]


def steps_done(out: Path, rank: int) -> list[tuple[int, int]]:
    """(step, pid) of each step rank ``rank`` completed, by every process that was that rank."""
    return [(s, p) for s, _, p in computed_steps(out, rank)]


def start_pids(text: str) -> dict[int, int]:
    found = re.search(r"started \d+ rank\(s\) \(rank:pid ([0-9:, ]+)\)", text)
    assert found, text[-3000:]
    return {int(r): int(p) for r, p in (item.split(":") for item in found.group(1).split(", "))}


def test_a_lost_node_of_an_hsdp_job_is_replaced_live_from_the_other_replica(
        tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 (server: the fixture)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job, master, out = f"hsdp-node-{os.getpid()}", free_port(), tmp_path / "out"

    def args(rank: int | None) -> list[str]:
        where = ["--standby"] if rank is None else ["--node-rank", str(rank)]
        return ["--nnodes", "2", *where, "--nproc-per-node", "2", "--job-id", job, "--server", server,
                "--master-addr", "127.0.0.1", "--master-port", str(master), "--stop-grace", "2",
                *script(out, 0.3)]

    (tmp_path / "reference").mkdir()
    procs = {f"node{r}": node(args(r), tmp_path / f"node{r}.log") for r in range(2)}
    procs["standby"] = node(args(None), tmp_path / "standby.log")
    procs["reference"] = node(["--nproc-per-node", "4", "--quiet", *script(tmp_path / "reference" / "out", 0.0)],
                              tmp_path / "reference.log")
    try:
        wait_for(lambda: all(len(steps_done(out, r)) >= KILL_AT for r in range(4)), 120, "every rank's first steps")
        pids = {r: p for n in range(2) for r, p in start_pids((tmp_path / f"node{n}.log").read_text()).items()}
        os.killpg(procs["node1"].pid, signal.SIGKILL)  # agent and ranks
        assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
        killed_at = time.time()
        done_before = {r: len(steps_done(out, r)) for r in range(4)}
        codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path, timeout=150)
        text = logs(tmp_path, "node0", "standby")
        assert set(codes.values()) == {0}, text
        said = "live recovery for this job: HSDP over a 2 x 2 mesh (replicate x shard)"
        assert said in text and "a lost node's ranks are replaced live too" in text, text
        assert "strategy: recover for rank(s) [2, 3]" in text and "job-rescheduling" not in text, text
        resumed = []
        for rank in range(4):
            done = steps_done(out, rank)
            assert [s for s, _ in done] == list(range(STEPS)), f"rank {rank} redid or skipped steps: {done}\n{text}"
            if rank < 2:  # node 0's ranks kept their processes
                assert {p for _, p in done} == {pids[rank]}, (rank, done, pids)
            else:  # node 1's ranks: their old processes up to the kill, the standby's after it
                first_new = done_before[rank]
                assert {p for _, p in done[:first_new]} == {pids[rank]}, (rank, done, pids)
                assert pids[rank] not in {p for _, p in done[first_new:]}, (rank, done, pids)
                resumed.append(first_new)
            assert_same_shards(out, tmp_path / "reference" / "out", rank)
        record = status(server, job)
        assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
        wait_for(lambda: leftovers(str(out)) == [], 15, "no process of the job left")
        print(f"HSDP 2 nodes x 2 ranks: node 1 SIGKILLed after step {min(resumed) - 1}, standby's ranks resumed; "
              f"job done {time.time() - killed_at:.1f}s after the kill, 0 steps redone")
    finally:
        kill_all(list(procs.values()))
