"""Issue 21 D7: FSDP2 inside `LiveGroup` declares at `track()` that it cannot be recovered live, so the first
fault takes job-rescheduling at once (a recover that could not work failed after 175 s, 260 steps redone)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.torch
def test_fsdp2_under_live_group_says_so_at_the_start_and_its_fault_takes_job_rescheduling(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2",
                           str(ROOT / "tests" / "torch_scripts" / "live_fsdp.py"), "8", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    took = time.monotonic() - started
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-4000:]
    said = "live recovery is off for this job: FSDPSequential is sharded by FSDP"
    assert console.count(said) >= 1 and console.index(said) < console.index("rank 1 (pid"), console[-4000:]
    assert "strategy: job-rescheduling" in console and "strategy: recover" not in console, console[-4000:]
    assert took < 100, f"{took:.0f}s"
