"""An unchanged multi-node torchrun line runs under taskd run (issue 32, F5).

`--nnodes 2 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id j2`, one `taskd run` per node
(two on loopback here, each in a directory of its own as on two hosts): node 0 hosts the job's controller next to
the endpoint (PORT + 1), node 1 finds it there, both authenticated by the secret of TASKD_TOKEN_FILE. Without the
file each node exits 2 with one line that says what to add. Before, both exited 2 asking for `taskd server`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import STARTED

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
DDP = ROOT / "tests" / "torch_scripts" / "ddp_train.py"
TIMEOUT = 120  # a wait's bound: 2 ranks importing torch on a loaded 2-core machine


def two_free_ports() -> int:
    """A port PORT with PORT + 1 free too (the endpoint, and node 0's controller beside it)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65534:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


def node(rank: int, port: int, cwd: Path, token_file: Path | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "MINDX_", "TORCHELASTIC_", "TASKD_"))
           and k not in ("JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    if token_file is not None:
        env["TASKD_TOKEN_FILE"] = str(token_file)
    cwd.mkdir(parents=True, exist_ok=True)
    argv = ["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "j2", str(DDP), "out"]
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "run", *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks (which hold the pipe open)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"taskd run did not finish within {TIMEOUT}s:\n{out}")
    return proc.returncode, out


@pytest.mark.torch
def test_the_unchanged_two_node_c10d_line_runs_with_a_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-shared-by-every-node-0123456789\n")
    token.chmod(0o600)
    port = two_free_ports()
    procs = [node(r, port, tmp_path / f"node{r}", token) for r in (0, 1)]
    results = [finish(p) for p in procs]
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"node {rank}:\n{out}\n\nother node:\n{results[1 - rank][1]}"
    assert f"controller 127.0.0.1:{port + 1} (embedded)" in results[0][1], results[0][1]
    assert f"node 1 of 2, 1 rank(s), controller 127.0.0.1:{port + 1}" in results[1][1], results[1][1]
    # node 0 kept the controller up until node 1's end was reported: node 1 did not retry it for 30 s
    assert "not acknowledged" not in results[1][1] and "unreachable" not in results[1][1], results[1][1]
    assert (tmp_path / "node0" / "out" / "final.pt").exists()  # rank 0 trained with rank 1 across the two nodes


def test_without_a_token_file_each_node_says_what_to_add(tmp_path: Path) -> None:
    port = two_free_ports()
    for rank in (0, 1):
        code, out = finish(node(rank, port, tmp_path / f"node{rank}", None))
        assert code == 2, out
        assert f"node 0's taskd run hosts the job's controller at 127.0.0.1:{port + 1}" in out, out
        assert "set TASKD_TOKEN_FILE=FILE on every node" in out, out
        assert "started" not in out  # nothing ran


GROWING = '''
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
ckpt = os.path.join(out, "step")  # torchrun's tutorial pattern: resume from the last snapshot
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
for step in range(start, int(sys.argv[2])):
    t = torch.ones(1)
    dist.all_reduce(t)
    with open(os.path.join(out, f"rank{rank}.log"), "a") as f:
        f.write(f"world {world} step {step} sum {int(t.item())}\\n")
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.5 if world == 1 else 0.05)  # alone it waits long enough for the second node to come
dist.destroy_process_group()
'''


def elastic_node(rank: int, port: int, cwd: Path, token_file: Path, script: Path, steps: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "MINDX_", "TORCHELASTIC_", "TASKD_"))
           and k not in ("JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["TASKD_TOKEN_FILE"] = str(token_file)
    cwd.mkdir(parents=True, exist_ok=True)
    argv = ["--nnodes", "1:2", "--node-rank", str(rank), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "grow", "--rdzv-conf", "last_call_timeout=2",
            str(script), str(cwd.parent / "out"), str(steps)]
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "run", *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    return proc


@pytest.mark.torch
def test_nnodes_1_2_starts_with_one_node_after_the_last_call_and_grows_when_a_second_arrives(tmp_path: Path) -> None:
    """F5: torchrun's `--nnodes 1:2` with one node starts after its last call and trains; a second node arriving
    restarts the workers with both. Before, taskd waited for node 1 until join_timeout."""
    import time

    token = tmp_path / "token"
    token.write_text("s3cret-shared-by-every-node-0123456789\n")
    token.chmod(0o600)
    script = tmp_path / "grow.py"
    script.write_text(GROWING)
    port = two_free_ports()
    log0 = tmp_path / "out" / "rank0.log"
    node0 = elastic_node(0, port, tmp_path / "node0", token, script, 40)
    deadline = time.monotonic() + 60  # the last call (2 s), then one rank importing torch on a loaded machine
    while time.monotonic() < deadline and node0.poll() is None and \
            (not log0.exists() or log0.read_text().count("world 1 step") < 3):
        time.sleep(0.2)
    assert log0.exists() and "world 1 step 2" in log0.read_text(), \
        (log0.read_text() if log0.exists() else "no rank output") + (node0.stdout.read() if node0.poll() else "")
    node1 = elastic_node(1, port, tmp_path / "node1", token, script, 40)
    results = [finish(p) for p in (node0, node1)]
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"node {rank}:\n{out}\n\nother node:\n{results[1 - rank][1]}"
    assert "job grow starts with 1 of 2 node(s) after" in results[0][1], results[0][1]
    assert "ranks start with WORLD_SIZE for the 1 of 2 node(s)" in results[0][1], results[0][1]
    lines0 = log0.read_text().splitlines()
    lines1 = (tmp_path / "out" / "rank1.log").read_text().splitlines()
    # alone (world 1, its all_reduce sums 1), then restarted with both from the last snapshot (sums 2)
    assert lines0[0] == "world 1 step 0 sum 1" and lines0[-1] == "world 2 step 39 sum 2", lines0
    resumed = int(lines1[0].split()[3])
    assert 3 <= resumed < 39 and lines1 == [f"world 2 step {s} sum 2" for s in range(resumed, 40)], lines1
    assert lines0[-len(lines1):] == lines1, lines0  # rank 0 ran the same steps with rank 1 after the growth
    assert "node 1 of 2" in results[1][1] and "job-rescheduling" in results[1][1], results[1][1]
