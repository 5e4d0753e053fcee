"""A controller restart while a live recover re-forms its group redoes nothing (issue 31, F2), end to end.

examples/torch/train_ddp.py (LiveGroup, gloo) on two `taskd run` nodes, one rank each, against one `taskd server`
with a state file. Rank 1 SIGKILLs itself; once the round is stored as RECOVERING (its replacement starting, the
survivor paused out of the broken group) the server is SIGKILLed and started again 1 s later on the same port and
state file. The round must go on where it was: the survivor keeps its pid, the replacement is started once (F2
measured it killed and replaced again, "2 recovery(ies)"), one restart charged, final.pt bit-identical.
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

from support import EXAMPLES, ROOT, free_port, leftovers, wait_for  # noqa: E402
from support.restartable import node, server, status  # noqa: E402

pytestmark = pytest.mark.torch

DDP = EXAMPLES / "torch" / "train_ddp.py"
SMALL = ["--hidden", "64", "--layers", "2", "--steps", "40", "--ckpt-every", "10", "--step-sleep", "0.05",
         "--pg-timeout", "30"]
# a lost node is declared lost 1 s after its stream ended; after the restart every agent has 10 s to come back
NODE_LOSS = ("--agent-loss-grace", "1", "--agent-loss-timeout", "10", "--agent-ping-interval", "1",
             "--agent-ping-timeout", "1", "--node-rejoin-timeout", "60")


def start_pids(console: str) -> dict[int, int]:
    """rank -> pid from the agent's "started 1 rank(s) (rank:pid 1:12)"."""
    found = re.search(r"started \d+ rank\(s\) \(rank:pid ([0-9:, ]+)\)", console)
    assert found, console[-3000:]
    return {int(r): int(p) for r, p in (item.split(":") for item in found.group(1).split(", "))}


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return fault_free(tmp_path_factory.mktemp("live-restart-reference"))


def assert_identical(final: dict, expected: dict) -> None:
    assert final.keys() == expected.keys()
    for key in final:
        assert torch.equal(final[key], expected[key]), f"{key} differs by {(final[key] - expected[key]).abs().max()}"


def kill_node(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def fault_free(tmp: Path) -> dict:
    """final.pt of the same training on one node with both ranks, no fault."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_"))} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", "--quiet", str(DDP), *SMALL,
                           "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=150)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return torch.load(tmp / "out" / "final.pt")


def test_a_controller_killed_during_a_live_recover_resumes_it_without_redoing_it(
        tmp_path: Path, expected: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = "f2-live"
    script = [str(DDP), *SMALL, "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
              "--crash", "1:8"]
    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    with server(tmp_path) as ctl:
        procs = [node(tmp_path, ctl.address, job, r, [*master, *script]) for r in range(2)]
        try:
            wait_for(lambda: ctl.stored_state(job) == "RECOVERING recover" or any(p.poll() is not None for p in procs),
                     90, "the live recover's round stored as RECOVERING", interval=0.01)
            ctl.kill()
            stored = ctl.stored_state(job)
            time.sleep(1.0)
            ctl.start()
            codes = [p.wait(timeout=90) for p in procs]
        finally:
            for p in procs:
                kill_node(p)
        consoles = [(tmp_path / f"node{r}.log").read_text() for r in range(2)]
        record = status(ctl.address, job)
        text = "\n".join(f"--- node{r}\n{c[-6000:]}" for r, c in enumerate(consoles))
        assert stored == "RECOVERING recover", f"killed too late: the round was stored as {stored}\n{text}"
        assert codes == [0, 0], f"{codes}\n{text}\n{ctl.logs()[-8000:]}"
    events = [e.get("kind") for e in record.get("events", [])]
    assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
    assert [r.get("strategiesTried") for r in record.get("rounds", [])] == [["recover"]], record.get("rounds")
    assert "round_restored" in events and "round_resumed" not in events, events
    # the recover ran once: the survivor kept its process, rank 1 was replaced once, nothing was rescheduled
    first = {**start_pids(consoles[0]), **start_pids(consoles[1])}
    info = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert info["ranks"]["0"]["pid"] == first[0], (info["ranks"], first)
    assert info["ranks"]["1"]["pid"] != first[1], (info["ranks"], first)
    assert len(re.findall(r"replaced rank\(s\) \[1\]", consoles[1])) == 1, consoles[1][-6000:]
    for console in consoles:
        assert console.count("strategy: recover for rank(s) [1]") == 1, console[-6000:]
        assert "job-rescheduling" not in console and "2 recovery(ies)" not in console, console[-6000:]
    assert_identical(torch.load(tmp_path / "out" / "final.pt"), expected)
    wait_for(lambda: leftovers(str(tmp_path / "out")) == [], 15, "no process of the job left")


def test_a_controller_killed_during_a_live_node_loss_recover_does_not_replace_the_replacement_again(
        tmp_path: Path, expected: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """F2's live node-loss round: node 1's whole `taskd run` is SIGKILLed, a replacement starts 2 s later, and the
    server is SIGKILLed while the round is RECOVERING (the replacement's rank joining the survivor's group), then
    restarted 1 s later. Its rank must be started once (F2: "killed and replaced again", 2 recoveries, 35.66 s)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = "f2-live-node"
    script = [str(DDP), *SMALL, "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]
    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    with server(tmp_path, NODE_LOSS) as ctl:
        procs = {f"node{r}": node(tmp_path, ctl.address, job, r, [*master, *script]) for r in range(2)}
        try:
            def computed(rank: int) -> int:
                path = tmp_path / "out" / f"rank{rank}.computed"
                return path.stat().st_size if path.exists() else 0

            wait_for(lambda: all(computed(r) >= 6 for r in range(2)), 90, "both ranks' first steps")
            first = start_pids((tmp_path / "node0.log").read_text())
            kill_node(procs.pop("node1"))  # agent and rank
            time.sleep(2.0)  # the replacement starts 2 s after the loss
            procs["replacement"] = node(tmp_path, ctl.address, job, 1, [*master, *script], name="replacement")
            wait_for(lambda: ctl.stored_state(job) == "RECOVERING recover"
                     or any(p.poll() is not None for p in procs.values()), 90, "the node-loss round RECOVERING",
                     interval=0.01)
            ctl.kill()
            stored = ctl.stored_state(job)
            time.sleep(1.0)
            ctl.start()
            codes = {name: p.wait(timeout=90) for name, p in procs.items()}
        finally:
            for p in procs.values():
                kill_node(p)
        consoles = {name: (tmp_path / f"{name}.log").read_text() for name in ("node0", "replacement")}
        record = status(ctl.address, job)
        text = "\n".join(f"--- {n}\n{c[-6000:]}" for n, c in consoles.items())
        assert stored == "RECOVERING recover", f"killed too late: the round was stored as {stored}\n{text}"
        assert codes == {"node0": 0, "replacement": 0}, f"{codes}\n{text}\n{ctl.logs()[-8000:]}"
    events = [e.get("kind") for e in record.get("events", [])]
    assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
    assert [r.get("strategiesTried") for r in record.get("rounds", [])] == [["recover"]], record.get("rounds")
    assert "round_restored" in events and "round_resumed" not in events, events
    info = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert info["ranks"]["0"]["pid"] == first[0], (info["ranks"], first)  # the survivor kept its process
    # the replacement's rank started once, never killed and started again: its one "replaced" line names the pid
    # that trained to the end
    started = re.findall(r"replaced rank\(s\) \[1\] with recover.*\(now rank:pid 1:(\d+)\)", consoles["replacement"])
    assert len(started) == 1 and "started 1 rank(s)" not in consoles["replacement"], consoles["replacement"][-6000:]
    assert info["ranks"]["1"]["pid"] == int(started[0]), info["ranks"]
    for console in consoles.values():
        assert console.count("strategy: recover for rank(s) [1]") == 1, console[-6000:]
        assert "job-rescheduling" not in console and "2 recovery(ies)" not in console, console[-6000:]
    assert_identical(torch.load(tmp_path / "out" / "final.pt"), expected)
    wait_for(lambda: leftovers(str(tmp_path / "out")) == [], 15, "no process of the job left")
