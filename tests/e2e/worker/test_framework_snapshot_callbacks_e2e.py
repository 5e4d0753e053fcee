"""The Hugging Face Trainer and PyTorch Lightning snapshot callbacks under `taskd run --nproc-per-node 2`
(DDP over gloo, CPU, models built in the script: no download): rank 1 SIGKILLed after step 5, every rank
restarted and resumed from memory with no step redone (snapshots every step); the Trainer's weights end
bit-identical to a fault-free run."""

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

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
STEPS, KILL_AT = 8, 5


def run(tmp: Path, script: str, name: str, *extra: str) -> tuple[list[dict], str]:
    job = f"{name}-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    for var in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_SNAPSHOT_MEMORY", "TASKD_SNAPSHOT_PERSIST_DIR"):
        env.pop(var, None)
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--job-id", job,
                             "--nproc-per-node", "2", str(HERE / script), "--steps", str(STEPS), "--out",
                             str(tmp / name), *extra], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT)
    STARTED.append(proc)
    assert proc.wait(timeout=240) == 0, log.read_text()[-5000:]
    assert glob.glob(f"/dev/shm/taskd-snap-{job}-*") == [], "the job's end must leave nothing in /dev/shm"
    return [json.loads((tmp / name / f"rank{r}.json").read_text()) for r in (0, 1)], log.read_text()


def check_resumed_from_memory(ranks: list[dict], text: str) -> None:
    assert "fault: rank 1" in text and "killed by SIGKILL" in text, text[-5000:]
    for got in ranks:
        assert got["restarts"] == 1 and got["restored_from"] == "memory", got
        assert got["resumed_from"] == KILL_AT and got["final"] == STEPS, got  # every step snapshotted: none redone


@pytest.mark.timeout(600)  # two jobs that import transformers: 140 s measured on 2 loaded cores
def test_hugging_face_trainer_resumes_from_memory_bit_identical(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    killed, text = run(tmp_path, "hf_job.py", "hf-kill", "--kill-at", str(KILL_AT))
    check_resumed_from_memory(killed, text)
    trainer_dir = str(tmp_path / "hf-kill" / "trainer")
    for got in killed:  # the Trainer's checkpoint folder on disk in its output_dir, never in tmpfs
        assert got["resume"].startswith(trainer_dir + os.sep) and got["snapshot_dir"], got
        assert not got["resume"].startswith(got["snapshot_dir"]) and not got["resume"].startswith("/dev/shm"), got
    assert not os.path.exists(os.path.join(trainer_dir, "taskd-resume")), "the resume folders must be removed"
    reference, _ = run(tmp_path, "hf_job.py", "hf-ref")
    assert [r["digest"] for r in killed] == [r["digest"] for r in reference], "weights differ from a fault-free run"


@pytest.mark.timeout(600)  # lightning's import alone took 45 s on 2 loaded cores
def test_lightning_trainer_resumes_from_memory(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    killed, text = run(tmp_path, "lightning_job.py", "pl-kill", "--kill-at", str(KILL_AT))
    check_resumed_from_memory(killed, text)
    assert killed[0]["digest"] == killed[1]["digest"], "the two DDP replicas diverged"
    root = str(tmp_path / "pl-kill" / "pl")  # the trainer's default_root_dir: the .ckpt on disk there, never in tmpfs
    for r, got in enumerate(killed):
        assert got["resume"] == os.path.join(root, "taskd-resume", f"rank{r}", f"step={KILL_AT}.ckpt"), got
        assert got["resume_existed"] and got["snapshot_dir"] and not got["resume"].startswith("/dev/shm"), got
    assert not os.path.exists(os.path.join(root, "taskd-resume")), "the resume files must be removed"
