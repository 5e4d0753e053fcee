"""FSDP2 (`fully_shard`, gloo, CPU) snapshots end to end under `taskd run`: 4 real ranks, a real SIGKILL.

A sharded job is not live: a rank's death restarts every rank (job-rescheduling). Each must restore its own
shards of model and optimizer from memory (not a fresh start), redo at most one step (a snapshot every step),
and end with shards bit-identical to a fault-free run; the job's end leaves nothing in /dev/shm.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support import STARTED

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[3]
FSDP2 = ROOT / "examples" / "torch" / "train_fsdp2.py"
STEPS = 16


def run_job(tmp: Path, name: str, *extra: str) -> tuple[Path, str]:
    job = f"{name}-{uuid.uuid4().hex[:8]}"
    out, log = tmp / name, tmp / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_SNAPSHOT_MEMORY", "TASKD_SNAPSHOT_FAULT"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--job-id", job,
                             "--nproc-per-node", "4", str(FSDP2), "--steps", str(STEPS), "--out", str(out),
                             "--snapshot-every", "1", *extra],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(proc)
    assert proc.wait(timeout=300) == 0, log.read_text()[-6000:]
    assert glob.glob(f"/dev/shm/taskd-snap-{job}-*") == [], "the job's end must leave nothing in /dev/shm"
    return out, log.read_text()


@pytest.mark.torch
def test_fsdp2_rank_sigkilled_every_rank_restores_its_shards_from_memory_bit_identical(tmp_path: Path) -> None:
    import torch

    reference, _ = run_job(tmp_path, "ref")
    out, text = run_job(tmp_path, "kill", "--kill-rank", "1", "--kill-at-step", "9")
    assert "fault: rank 1" in text and "job-rescheduling" in text, text[-6000:]
    for rank in range(4):
        summary = json.loads((out / f"rank{rank}.json").read_text())
        assert summary["restart_count"] == 1 and summary["restored_from"] == "memory", summary
        assert 8 <= summary["resumed_from"] <= 9, summary
        redone = summary["computed"] - STEPS
        assert 0 <= redone <= 1, f"rank {rank} redid {redone} steps (snapshots every step: at most 1)"
        got, want = torch.load(out / f"rank{rank}.pt"), torch.load(reference / f"rank{rank}.pt")
        assert set(got) == set(want) and want, (sorted(got), sorted(want))
        for key in want:
            assert torch.equal(got[key], want[key]), f"rank {rank}: shard {key} differs from the fault-free run"
