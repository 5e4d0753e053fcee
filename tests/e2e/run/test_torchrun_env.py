"""The environment a rank sees under `taskd run`, compared with what torchrun gives the same script and line.

The probe (tests/torch_scripts/env_probe.py) needs no torch; torchrun itself does, so the tests
skip without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import STARTED, free_port, wait_for

pytest.importorskip("torch.distributed.run")

ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "tests" / "torch_scripts" / "env_probe.py"
TIMEOUT = 90  # a wait's bound on a loaded 2-core machine, not an expectation
LAUNCHERS = {"torchrun": ("-m", "torch.distributed.run"), "taskd": ("-m", "taskd", "run")}
OMP_WARNING = "Setting OMP_NUM_THREADS environment variable for each process to be 1"
# Set to torchrun's values for the same line (ROLE_* for a job with one role: the global rank and world).
SAME = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what an outer launcher or cluster would have set."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PET_", "MINDX_", "TORCHELASTIC_", "TASKD_", "OMP_"))
           and k not in ("JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env | extra


def start(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, *cmd], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"{proc.args} did not finish within {TIMEOUT}s:\n{out}")
    return proc.returncode, out


def launch(launcher: str, argv: list[str], cwd: Path, **env: str) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    code, out = finish(start([*LAUNCHERS[launcher], *argv], cwd, clean_env(**env)))
    assert code == 0, f"{launcher} {argv}:\n{out}"
    return out


def starts(out: Path, rank: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob(f"start_rank{rank}_*.json")]


def finals(out: Path, world: int) -> dict[int, dict]:
    return {r: json.loads((out / f"final_rank{r}.json").read_text()) for r in range(world)}


# --master-port: without it, a one-node torchrun switches to the c10d rendezvous and a random run id.
LINE = ["--nproc-per-node", "2", "--rdzv-id", "job7", "--master-port", str(free_port()), "--max-restarts", "1",
        "--role", "trainer", str(PROBE), "out"]


def test_rank_environment_is_torchruns(tmp_path: Path) -> None:
    seen, console = {}, {}
    for launcher in LAUNCHERS:
        console[launcher] = launch(launcher, LINE, tmp_path / launcher)
        seen[launcher] = {r: starts(tmp_path / launcher / "out", r) for r in range(2)}
        assert all(len(seen[launcher][r]) == 1 for r in range(2)), seen[launcher]
    for rank in range(2):
        ours, theirs = seen["taskd"][rank][0], seen["torchrun"][rank][0]
        assert {k: ours[k] for k in SAME} == {k: theirs[k] for k in SAME}, f"rank {rank}"
        assert ours["OMP_NUM_THREADS"] == "1" and ours["ROLE_NAME"] == "trainer" and ours["GROUP_WORLD_SIZE"] == "1"
        assert ours["TORCHELASTIC_RUN_ID"] == "job7" and ours["TORCHELASTIC_MAX_RESTARTS"] == "1"
        error_file = ours["TORCHELASTIC_ERROR_FILE"]
        assert error_file and os.path.isabs(error_file) and error_file.endswith(".json"), error_file
        assert theirs["TORCHELASTIC_ERROR_FILE"], "torchrun sets one too"
    assert seen["taskd"][0][0]["TORCHELASTIC_ERROR_FILE"] != seen["taskd"][1][0]["TORCHELASTIC_ERROR_FILE"]
    for launcher in LAUNCHERS:
        assert OMP_WARNING in console[launcher], f"{launcher} warns that it set OMP_NUM_THREADS"


def test_omp_num_threads_set_by_the_user_is_kept(tmp_path: Path) -> None:
    for launcher in LAUNCHERS:
        console = launch(launcher, LINE, tmp_path / launcher, OMP_NUM_THREADS="3")
        got = [s["OMP_NUM_THREADS"] for r in range(2) for s in starts(tmp_path / launcher / "out", r)]
        assert got == ["3", "3"], launcher
        assert OMP_WARNING not in console, launcher


CRASH_LINE = ["--nproc-per-node", "2", "--max-restarts", "3", "--monitor-interval", "0.2", str(PROBE), "out",
              "--crash-rank1", "2"]


def test_restart_count_after_recoveries_is_torchruns_on_every_rank(tmp_path: Path) -> None:
    """Rank 1 crashes twice; a plain script (no in-place rejoin declared) has the whole job restarted, as torchrun."""
    counts = {}
    for launcher in LAUNCHERS:
        console = launch(launcher, CRASH_LINE, tmp_path / launcher)
        final = finals(tmp_path / launcher / "out", 2)
        counts[launcher] = {r: final[r]["TORCHELASTIC_RESTART_COUNT"] for r in range(2)}
        assert counts[launcher][0] == counts[launcher][1], f"{launcher}: {counts[launcher]}\n{console}"
    assert counts["taskd"] == counts["torchrun"] == {0: "2", 1: "2"}


@contextlib.contextmanager
def taskd_server(tmp: Path) -> Iterator[int]:
    port = free_port()
    server = start(["-m", "taskd", "server", "--listen", f"127.0.0.1:{port}", "--state", ":memory:"], tmp,
                   clean_env())
    try:
        def listening() -> bool:
            with contextlib.suppress(OSError), __import__("socket").create_connection(("127.0.0.1", port), 0.2):
                return True
            return False

        wait_for(listening, 30, "taskd server to listen")
        yield port
    finally:
        server.terminate()
        finish(server)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Two one-rank nodes on one controller; node 1's rank crashes twice. Each rank's final restart count."""
    tmp = tmp_path_factory.mktemp("two_nodes")
    with taskd_server(tmp) as port:
        nodes = [start([*LAUNCHERS["taskd"], "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
                        "--job-id", "envjob", "--server", f"127.0.0.1:{port}", "--max-restarts", "3",
                        "--master-port", str(free_port()), "--monitor-interval", "0.2", str(PROBE), "out",
                        "--crash-rank1", "2"], tmp, clean_env()) for n in range(2)]
        results = [finish(node) for node in nodes]
    assert [code for code, _ in results] == [0, 0], "\n".join(out for _, out in results)
    final = finals(tmp / "out", 2)
    return {r: final[r]["TORCHELASTIC_RESTART_COUNT"] for r in range(2)}


def test_restart_count_is_job_wide_across_nodes(two_nodes: dict[int, str]) -> None:
    """Node 0's rank never failed, yet its last incarnation counts the job's 2 restarts, as node 1's does."""
    assert two_nodes == {0: "2", 1: "2"}
