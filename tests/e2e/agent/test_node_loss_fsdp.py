"""A lost node of a live pure FSDP2 job is recovered live onto a standby (issue 34, item 3): one `taskd server`, two
`taskd run` nodes of 2 ranks and a `taskd run --standby`, examples/torch/train_fsdp2_live.py with
``LiveGroup(snapshot_every=1)``: no peer holds a rank's shards, so the standby's ranks restore theirs from the copy
of node 1's snapshots that node 0's agent (its buddy) holds (issue 33's peer replication).

Node 1's ranks stall after their update of step STALL_AT and before its snapshot; once node 0's agent holds their
snapshots of the step before, node 1's whole `taskd run` (agent and ranks) is SIGKILLed. Node 0's ranks, which went
on into step STALL_AT + 1, keep their processes and roll back in place to STALL_AT, the newest step every rank holds;
the standby's ranks restore it from the buddy's copy. One step is redone (k = 1) and the final shards are
bit-identical to a fault-free run's (one node with 4 ranks, run alongside)."""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import free_port, leftovers, wait_for  # noqa: E402
from support.run import assert_same_shards, computed_steps  # noqa: E402
from test_node_loss_e2e import finish, kill_all, logs, node, server, status  # noqa: E402,F401 (server: a fixture)
from test_node_loss_hsdp import start_pids  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
FSDP = ROOT / "examples" / "torch" / "train_fsdp2_live.py"
STEPS, STALL_AT = 5, 2  # node 1's ranks stall in step STALL_AT (0-based), their snapshot of it never taken


def script(out: Path, *extra: str) -> list[str]:
    return [str(FSDP), "--steps", str(STEPS), "--snapshot-every", "1", "--hidden", "32", "--layers", "2",
            "--pg-timeout", "60", "--out", str(out), *extra]


def buddy_holds(job: str, step: int) -> bool:
    """Whether an agent holds node 1's copy of ``step`` for both its ranks (snapshot ``step``: the state after
    ``step`` steps, what node 1's ranks published before they stalled in step ``step``)."""
    return all(glob.glob(f"/dev/shm/taskd-snap-{job}-*/peer/node1/rank{r}/s{step:012d}.snap") for r in (2, 3))


def test_a_lost_node_of_an_fsdp2_job_restores_its_shards_from_the_buddys_copy(
        tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 (server: the fixture)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job, master, out = f"fsdp-node-{os.getpid()}", free_port(), tmp_path / "out"

    def args(rank: int | None) -> list[str]:
        where = ["--standby"] if rank is None else ["--node-rank", str(rank)]
        return ["--nnodes", "2", *where, "--nproc-per-node", "2", "--job-id", job, "--server", server,
                "--master-addr", "127.0.0.1", "--master-port", str(master), "--stop-grace", "2",
                *script(out, "--stall-ranks", "2,3", "--kill-at-step", str(STALL_AT))]

    (tmp_path / "reference").mkdir()
    procs = {f"node{r}": node(args(r), tmp_path / f"node{r}.log") for r in range(2)}
    procs["standby"] = node(args(None), tmp_path / "standby.log")
    procs["reference"] = node(["--nproc-per-node", "4", "--quiet", *script(tmp_path / "reference" / "out")],
                              tmp_path / "reference.log")
    try:
        wait_for(lambda: all((out / f"stalled{r}").exists() for r in (2, 3)), 150, "node 1's ranks to stall")
        wait_for(lambda: buddy_holds(job, STALL_AT), 60, f"node 0's agent to hold node 1's snapshots of {STALL_AT}")
        pids = {r: p for n in range(2) for r, p in start_pids((tmp_path / f"node{n}.log").read_text()).items()}
        os.killpg(procs["node1"].pid, signal.SIGKILL)  # agent and ranks
        assert procs["node1"].wait(timeout=10) == -signal.SIGKILL
        killed_at = time.time()
        codes = finish({k: v for k, v in procs.items() if k != "node1"}, tmp_path, timeout=180)
        text = logs(tmp_path, "node0", "standby")
        assert set(codes.values()) == {0}, text
        said = "live recovery for this job: FSDP2 over 4 ranks"
        assert said in text and "a lost node's ranks are replaced live too" in text, text
        assert f"rank(s) 2, 3 restored step {STALL_AT} from the buddy's copy (node 0's agent)" in text, text
        assert "strategy: recover for rank(s) [2, 3]" in text and "job-rescheduling" not in text, text
        resumed = []
        for rank in range(4):
            done = computed_steps(out, rank)
            # every rank completed STALL_AT (node 1's never snapshotted it) and rolls back to it: 1 step redone
            assert [s for s, _, _ in done] == [*range(STALL_AT + 1), *range(STALL_AT, STEPS)], \
                f"rank {rank}: {done}\n{text}"
            record = json.loads((out / f"rank{rank}.json").read_text())
            if rank < 2:  # node 0's ranks kept their processes and rolled back from their node's memory
                assert {p for _, _, p in done} == {pids[rank]} and record["restored_from"] == "memory", (rank, done)
            else:  # node 1's: their old processes up to the kill, the standby's after it, from the buddy's copy
                assert {p for _, _, p in done[:STALL_AT + 1]} == {pids[rank]}, (rank, done, pids)
                assert pids[rank] not in {p for _, _, p in done[STALL_AT + 1:]}, (rank, done, pids)
                assert record["restored_from"] == "buddy", (rank, record)
            resumed.append(done[STALL_AT + 1][1] - killed_at)
            assert_same_shards(out, tmp_path / "reference" / "out", rank)
        record = status(server, job)
        assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
        wait_for(lambda: leftovers(str(out)) == [], 15, "no process of the job left")
        print(f"FSDP2 2 nodes x 2 ranks, k=1: node 1 SIGKILLed in step {STALL_AT}; every rank redid step {STALL_AT} "
              f"{max(resumed):.1f}s after the kill (standby's ranks restored from the buddy's copy), load "
              f"{os.getloadavg()[0]:.1f}")
    finally:
        kill_all(list(procs.values()))
