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
