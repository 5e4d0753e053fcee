"""`taskd run` as the e2e tests start it (shared by tests/e2e/run, agent and others)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, STARTED

EXAMPLE = ROOT / "examples" / "train_resumable.py"


def taskd_run(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`taskd run ARGS` from the repository, its console into `log`, with no controller address from outside;
    killed after the test if it is still running (tests/conftest.py)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MINDX_SERVER_IP", None)
    full_env.pop("MINDX_TASK_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    STARTED.append(proc)
    return proc


def run_to_end(argv: list[str], console: Path, timeout: float, env: dict[str, str] | None = None,
               cwd: Path = ROOT) -> tuple[int, str]:
    """Run `argv` (a `taskd run` line) with its console in `console` until it exits: (code, console text).
    Past `timeout` it is killed and the test fails with the console's tail."""
    with console.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        STARTED.append(proc)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"{' '.join(argv[1:4])} did not finish in {timeout:.0f}s:\n{console.read_text()[-6000:]}")
    return code, console.read_text()


def wait_ok(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    """Wait for a `taskd run` to exit 0 within `timeout` and return its console; else kill it and fail the test
    with the console's tail."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        pytest.fail(f"taskd run did not finish in {timeout:.0f}s:\n{log.read_text()[-6000:]}")
    console = log.read_text()
    assert code == 0, console[-6000:]
    return console


def computed_steps(out: Path, rank: int) -> list[tuple[int, float, int]]:
    """(step, time, pid) of each step rank ``rank`` completed, by every process that was that rank, from the
    `rankN.computed` file the sharded examples append to (a line still being written is left out)."""
    path = out / f"rank{rank}.computed"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(s), float(t), int(p)) for s, t, p in (line.split() for line in lines if line.count(" ") == 2)]


def assert_same_shards(out: Path, reference: Path, rank: int) -> None:
    """Rank ``rank``'s final shards (`rankN.pt`, what the sharded examples save) in ``out`` are bit-identical to a
    fault-free run's in ``reference``."""
    import torch

    mine, theirs = torch.load(out / f"rank{rank}.pt"), torch.load(reference / f"rank{rank}.pt")
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), f"rank {rank} {key} differs from the fault-free run's"
