"""A lost node of a live DDP job is recovered live (issue 17): one `taskd server`, 2 or 3 `taskd run` nodes here.

examples/torch/train_ddp.py (LiveGroup, gloo, 2 ranks per node). Node 1's whole `taskd run` (agent and
ranks: its process group) is SIGKILLed mid-training and a replacement `taskd run --node-rank 1` starts 2 s
later. The survivors' ranks keep their processes and wait, out of their broken group, for the next
generation; the replacement's ranks start as joiners of it and receive the state from them in memory.
Every node exits 0, final.pt is bit-identical to a fault-free run's, the survivors recompute no step and
the replacement's ranks at most one, and no process of the job is left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import free_port, leftovers, wait_for  # noqa: E402
from test_node_loss_e2e import finish, kill_all, logs, node, server, status  # noqa: E402,F401 (server: a fixture)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
DDP = ROOT / "examples" / "torch" / "train_ddp.py"
PER_NODE = 2
STEPS = 24
KILL_AT = 6  # node 1 is killed once every rank completed this many steps


def ddp_args(tmp: Path) -> list[str]:
    return [str(DDP), "--hidden", "32", "--layers", "1", "--inputs", "32", "--steps", str(STEPS), "--ckpt-every", "0",
            "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out"), "--step-sleep", "0.05", "--pg-timeout", "30"]


def computed(tmp: Path, rank: int) -> int:
    path = tmp / "out" / f"rank{rank}.computed"
    return path.stat().st_size if path.exists() else 0


def start_pids(text: str) -> dict[int, int]:
    """global rank -> pid from the agent's "started 2 rank(s) (rank:pid 2:11, 3:12)"."""
    found = re.search(r"started \d+ rank\(s\) \(rank:pid ([0-9:, ]+)\)", text)
    assert found, text[-3000:]
    return {int(r): int(p) for r, p in (item.split(":") for item in found.group(1).split(", "))}


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """final.pt of fault-free runs, by world size (one node with every rank: the same updates as N nodes)."""
    refs: dict[int, dict] = {}

    def get(world: int) -> dict:
        if world not in refs:
            tmp = tmp_path_factory.mktemp(f"ddp-baseline-{world}")
            proc = node(["--nproc-per-node", str(world), "--quiet", *ddp_args(tmp)], tmp / "console.log")
            assert proc.wait(timeout=120) == 0, (tmp / "console.log").read_text()[-5000:]
            refs[world] = torch.load(tmp / "out" / "final.pt")
        return refs[world]

    return get  # type: ignore[return-value]


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_lost_node_of_a_live_ddp_job_is_replaced_live(tmp_path: Path, server: str, fault_free,  # noqa: F811
                                                         nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the nodes' environment (2 cores for up to 6 ranks)
    world = nodes * PER_NODE
    reference = fault_free(world)
    master = free_port()

    def job(rank: int) -> list[str]:
        return ["--nnodes", str(nodes), "--node-rank", str(rank), "--nproc-per-node", str(PER_NODE), "--job-id",
                f"live{nodes}", "--server", server, "--master-addr", "127.0.0.1", "--master-port", str(master),
                "--stop-grace", "2", *ddp_args(tmp_path)]

    procs = {f"node{r}": node(job(r), tmp_path / f"node{r}.log") for r in range(nodes)}
    try:
        wait_for(lambda: all(computed(tmp_path, r) >= KILL_AT for r in range(world)), 90, "every rank's first steps")
        old = procs["node1"]
        pids = {r: p for n in range(nodes) for r, p in start_pids((tmp_path / f"node{n}.log").read_text()).items()}
        os.killpg(old.pid, signal.SIGKILL)  # agent and ranks
        assert old.wait(timeout=10) == -signal.SIGKILL
        killed_at = time.monotonic()
        time.sleep(2)  # the scenario: a replacement started 2 s after the loss
        procs["replacement"] = node(job(1), tmp_path / "replacement.log")
        alive = {k: v for k, v in procs.items() if k != "node1"}
        codes = finish(alive, tmp_path, timeout=120)
        took = time.monotonic() - killed_at
        text = logs(tmp_path, *alive)
        assert set(codes.values()) == {0}, text
        info = json.loads((tmp_path / "out" / "summary.json").read_text())
        lost = {PER_NODE, PER_NODE + 1}
        survivors = [r for r in range(world) if r not in lost]
        assert {r: info["ranks"][str(r)]["pid"] for r in survivors} == {r: pids[r] for r in survivors}, text
        assert all(info["ranks"][str(r)]["pid"] != pids[r] for r in lost)
        final = torch.load(tmp_path / "out" / "final.pt")
        assert final.keys() == reference.keys()
        for key in final:
            assert torch.equal(final[key], reference[key]), f"{key}: {(final[key] - reference[key]).abs().max()}"
        assert all(info["recomputed"][str(r)] == 0 for r in survivors), info["recomputed"]
        assert all(info["recomputed"][str(r)] <= 1 for r in lost), info["recomputed"]
        assert "strategy: recover for rank(s) [2, 3]" in text and "job-rescheduling" not in text, text
        generations = {info["ranks"][str(r)]["generation"] for r in range(world)}
        assert len(generations) == 1 and generations != {0}, info  # the survivors rejoined the one the new ranks joined
        assert all(len(info["ranks"][str(r)]["recoveries"]) == 1 for r in survivors), info
        assert not re.search(r"re-formed \(generation \d+\) in 0\.0", (tmp_path / "replacement.log").read_text())
        record = status(server, f"live{nodes}")
        assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
        shown = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", server, "--job", f"live{nodes}"],
                               capture_output=True, text=True, timeout=30, cwd=ROOT).stdout
        new_pid = procs["replacement"].pid
        assert re.search(rf"node 1 lost \(agent [^:]+:{old.pid}\) at .*, replaced by [^:]+:{new_pid} at .*; lost -> "
                         r"round ended \d+\.\d+s", shown), shown  # its node, old and new host:pid, how long
        wait_for(lambda: leftovers(str(tmp_path / "out")) == [], 15, "no process of the job left")
        print(f"{nodes} nodes: node 1 SIGKILLed -> job done {took:.1f}s later")
    finally:
        kill_all(list(procs.values()))
