"""The unchanged torchrun tutorial pattern recovers under `taskd run` with its restart budget (issue 32, Done when).

examples/torch/multigpu_torchrun.py is pytorch/examples' ddp-tutorial-series `multigpu_torchrun.py` on CPU: no
taskd import; rank 0 snapshots {model, epochs run} every epoch and every rank resumes from it at start. Rank 1
is SIGKILLed once the first snapshot exists: every rank restarts (job-rescheduling, 1 of --max-restarts 1), all
resume from the snapshot, the job exits 0. docs/pytorch.md, "Coming from torchrun", says what it redoes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import STARTED

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "torch" / "multigpu_torchrun.py"
TIMEOUT = 120


def rank_pid(agent: int, rank: int) -> int | None:
    for p in psutil.Process(agent).children(recursive=True):
        try:
            if "multigpu_torchrun.py" in " ".join(p.cmdline()) and p.environ().get("RANK") == str(rank):
                return p.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.torch
def test_the_tutorial_pattern_resumes_from_its_snapshot_after_a_rank_is_killed(tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_", "TORCHELASTIC_"))}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "run", "--nproc-per-node", "2", "--max-restarts", "1",
                             str(SCRIPT), "6", "1", "--snapshot-path", str(snapshot),
                             "--out", str(tmp_path / "final.pt"), "--epoch-sleep", "0.5"],
                            cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not snapshot.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        victim = rank_pid(proc.pid, 1)
        assert snapshot.exists() and victim is not None, "no snapshot, or rank 1 already gone"
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
    assert proc.returncode == 0, out
    resumed = [int(e) for e in re.findall(r"Resuming training from snapshot at Epoch (\d+)", out)]
    assert len(resumed) == 2 and resumed[0] == resumed[1] >= 0, out  # both ranks, from the same snapshot
    assert "job-rescheduling" in out and "1 fault(s)" in out, out
    assert re.search(rf"\[GPU1\] Epoch {resumed[0]} \|", out.rsplit("Resuming training", 1)[1]), out  # redone
    assert "[GPU0] Epoch 5 |" in out and (tmp_path / "final.pt").exists(), out
