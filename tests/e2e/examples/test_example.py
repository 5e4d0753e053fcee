"""examples/train_resumable.py: crash + resume gives bit-identical parameters, standalone and under the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import wait_for

from taskd.launcher import STATUS_FAILED, STATUS_OK, LocalLauncher, WorkerSpec, command_for
from taskd.worker import CheckpointManager, HeartbeatFile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(REPO, "examples", "train_resumable.py")
TIMEOUT = 60.0
LAUNCHER_VARS = ("RANK", "RANK_ID", "LOCAL_RANK", "DEVICE_ID", "MS_WORKER_NUM", "WORLD_SIZE", "RANK_SIZE",
                 "TASKD_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TASKD_HEARTBEAT_FILE", "TASKD_HEARTBEAT_DIR")
ARGS = ["--steps", "40", "--ckpt-every", "5"]


def env_for(rank: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if rank is not None:
        env["RANK"] = str(rank)
    return env


def run_example(tmp, name: str, rank: int, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, EXAMPLE, *ARGS, "--ckpt-dir", str(tmp / name / "ckpt"), "--out", str(tmp / name / "out"),
           *extra]
    return subprocess.run(cmd, env=env_for(rank), capture_output=True, text=True, timeout=TIMEOUT)


def summary(tmp, name: str, rank: int) -> dict:
    return json.loads((tmp / name / "out" / f"rank{rank}.json").read_text())


def params(tmp, name: str, rank: int) -> np.ndarray:
    return np.load(tmp / name / "out" / f"rank{rank}.npy")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs of ranks 0 and 1."""
    tmp = tmp_path_factory.mktemp("reference")
    for rank in (0, 1):
        result = run_example(tmp, "ref", rank)
        assert result.returncode == 0, result.stderr
        assert summary(tmp, "ref", rank) == {"rank": rank, "steps": 40, "computed": 40, "resumed_from": 0,
                                             "restart_count": 0, "restored_from": None}
    return {rank: params(tmp, "ref", rank) for rank in (0, 1)}


def test_standalone_runs_as_rank_0_without_taskd(tmp_path, reference):
    result = run_example(tmp_path, "plain", None)
    assert result.returncode == 0, result.stderr
    assert np.array_equal(params(tmp_path, "plain", 0), reference[0])
    assert "rank 0: done" in result.stdout


def test_crash_once_then_resume_is_bit_identical(tmp_path, reference):
    first = run_example(tmp_path, "crash", 1, "--crash-once-at-step", "17")
    assert first.returncode == 1
    assert "crashing at step 17" in first.stderr
    assert (tmp_path / "crash" / "out" / "crashed_once.rank1").exists()
    assert CheckpointManager(tmp_path / "crash" / "ckpt" / "rank1").latest_step() == 15
    second = run_example(tmp_path, "crash", 1, "--crash-once-at-step", "17")  # does not crash again
    assert second.returncode == 0, second.stderr
    assert summary(tmp_path, "crash", 1)["resumed_from"] == 15
    assert summary(tmp_path, "crash", 1)["computed"] == 17 + (40 - 15)
    assert summary(tmp_path, "crash", 1)["restored_from"] == "disk"  # outside taskd: no snapshots, the disk
    got = params(tmp_path, "crash", 1)
    assert got.dtype == reference[1].dtype and got.tobytes() == reference[1].tobytes()


def test_rank_0_ignores_crash_once(tmp_path):
    result = run_example(tmp_path, "r0", 0, "--crash-once-at-step", "3")
    assert result.returncode == 0, result.stderr
    assert summary(tmp_path, "r0", 0)["resumed_from"] == 0


def test_under_the_launcher_crash_and_restart_one_rank(tmp_path, reference):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    spec = WorkerSpec(command_for(EXAMPLE, [*ARGS, "--ckpt-dir", str(ckpt), "--out", str(out),
                                            "--crash-once-at-step", "12"]),
                      nproc_per_node=2, log_dir=str(tmp_path / "logs"), extra_env={"PYTHONPATH": REPO})
    with LocalLauncher(spec) as launcher:
        assert launcher.start_all_worker() == 0
        wait_for(lambda: launcher.monitor([1])[1]["status"] == STATUS_FAILED, what="rank 1 to crash")
        assert launcher.returncode(1) == 1
        assert any("crashing at step 12" in line for line in launcher.tail_log(1))
        assert launcher.start_worker_list([1]) == 0
        wait_for(lambda: all(e["status"] == STATUS_OK for e in launcher.monitor([-1]).values()),
                 what="both ranks to finish")
    for rank in (0, 1):
        assert np.load(out / f"rank{rank}.npy").tobytes() == reference[rank].tobytes()
    restarted = json.loads((out / "rank1.json").read_text())
    # the launcher holds the job's snapshots in /dev/shm: the restarted rank takes up at the step it had reached
    assert restarted["restart_count"] == 1 and restarted["resumed_from"] == 12
    assert restarted["restored_from"] == "memory" and restarted["computed"] == 40  # no step redone
    log1 = (tmp_path / "logs" / "rank_1.log").read_text()
    assert "starting at step 0/40 (restart 0)" in log1 and "starting at step 12/40 (restart 1, from memory)" in log1


def test_save_request_makes_the_example_checkpoint_now(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    spec = WorkerSpec(command_for(EXAMPLE, ["--steps", "100000", "--ckpt-every", "1000000", "--step-sleep", "0.005",
                                            "--ckpt-dir", str(ckpt), "--out", str(out)]),
                      nproc_per_node=1, extra_env={"PYTHONPATH": REPO})
    with LocalLauncher(spec) as launcher:
        launcher.start_all_worker()
        with HeartbeatFile(launcher.heartbeat_path(0)) as hb:
            wait_for(lambda: (hb.read().step or 0) > 3, what="training to make progress")
            number = hb.request_save()
            state = hb.wait_save(number, timeout=TIMEOUT)
            assert state is not None and state.save_ok
        manager = CheckpointManager(ckpt / "rank0")
        saved = manager.load_latest()
        assert saved is not None
        assert saved[0]["step"] == saved[1] <= state.step
        assert launcher.monitor([0])[0]["status"] is None  # still training
