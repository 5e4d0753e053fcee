"""In-memory snapshots end to end under `taskd run`: real ranks, real SIGKILLs, the job's /dev/shm directory.

- a plain torch DDP script (no LiveGroup), 4 ranks, a rank SIGKILLed: every rank restored from memory, at most
  one step redone, parameters bit-identical to a fault-free run;
- a rank SIGKILLed, and one byte of another rank's newest snapshot flipped before the restart: every rank restores
  the same older step from memory (a consistent cut), and the damaged copy's rank says which and why;
- a rank SIGKILLed inside the copy of its snapshot: that snapshot is never restored;
- `taskd run` SIGKILLed: the next `taskd run` on the node removes the directory it left;
- a cap too small: snapshots off, the message names the fallback, the ranks resume from their disk checkpoints;
- a full /dev/shm (a 64 KiB tmpfs in the job's own mount namespace): the same, with the filesystem named as full;
- every job's end leaves nothing of it in /dev/shm.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from support import STARTED, wait_for

ROOT = Path(__file__).resolve().parents[3]
PLAIN = ROOT / "examples" / "torch" / "train_plain.py"
EXAMPLE = ROOT / "examples" / "train_resumable.py"
SHM = "/dev/shm"


def job_dirs(job: str) -> list[str]:
    return glob.glob(os.path.join(SHM, f"taskd-snap-{job}-*"))


def taskd_run(job: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for var in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_SNAPSHOT_MEMORY", "TASKD_SNAPSHOT_FAULT"):
        if var not in (env or {}):
            full_env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--job-id", job, *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen[bytes], log: Path, job: str, timeout: float = 240) -> str:
    assert proc.wait(timeout=timeout) == 0, log.read_text()
    assert job_dirs(job) == [], "the job's end must leave nothing in /dev/shm"
    return log.read_text()


def new_job(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------ a plain torch script, 4 ranks

PLAIN_STEPS = 30


def plain_run(tmp: Path, name: str, *extra: str) -> tuple[Path, str]:
    job = new_job(name)
    out, log = tmp / name, tmp / f"{name}.log"
    proc = taskd_run(job, ["--nproc-per-node", "4", str(PLAIN), "--steps", str(PLAIN_STEPS), "--out", str(out),
                           "--snapshot-every", "1", *extra], log)
    return out, finish(proc, log, job)


def test_plain_torch_rank_sigkilled_restores_every_rank_from_memory_bit_identical(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    reference, _ = plain_run(tmp_path, "ref")
    out, text = plain_run(tmp_path, "kill", "--kill-rank", "1", "--kill-at-step", "17")
    assert "fault: rank 1" in text and "job-rescheduling" in text, text
    for rank in range(4):
        summary = json.loads((out / f"rank{rank}.json").read_text())
        assert summary["restart_count"] == 1 and summary["restored_from"] == "memory", summary
        assert 16 <= summary["resumed_from"] <= 17, summary
        redone = summary["computed"] - PLAIN_STEPS
        assert 0 <= redone <= 1, f"rank {rank} redid {redone} steps (snapshots every step: at most 1)"
        got = torch.load(out / f"rank{rank}.pt")
        want = torch.load(reference / f"rank{rank}.pt")
        for key in want:
            assert torch.equal(got[key], want[key]), f"rank {rank}: {key} differs from the fault-free run"


def flip_a_byte(path: str) -> None:
    """One byte in the middle of the segment's body (its header says how long the body is: the file is longer)."""
    with open(path, "r+b") as fh:
        length = struct.unpack_from("<Q", fh.read(64), 32)[0]
        fh.seek(64 + length // 2)
        byte = fh.read(1)
        fh.seek(64 + length // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_snapshot_moves_every_rank_to_the_same_older_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job, out, log, gate = new_job("flip"), tmp_path / "flip", tmp_path / "flip.log", tmp_path / "gate"
    proc = taskd_run(job, ["--nproc-per-node", "2", str(PLAIN), "--steps", "8", "--out", str(out),
                           "--snapshot-every", "1", "--snapshot-keep", "3", "--kill-rank", "1", "--kill-at-step", "5",
                           "--restart-gate", str(gate)], log)
    # the restarted ranks wait at the gate: the killed run's processes are gone, their snapshots settled
    wait_for(lambda: all(os.path.exists(f"{gate}.waiting{r}") for r in (0, 1)), 180, "both restarted ranks at the gate")
    [folder] = job_dirs(job)
    held = [{int(n[1:13]) for n in os.listdir(os.path.join(folder, f"rank{r}")) if n.endswith(".snap")}
            for r in (0, 1)]
    newest = max(held[0] & held[1])
    assert newest - 1 in held[0] & held[1], held
    flip_a_byte(os.path.join(folder, "rank0", f"s{newest:012d}.snap"))
    gate.touch()
    text = finish(proc, log, job)
    assert f"rank 0: its snapshot of step {newest} in memory fails its check" in text, text
    assert "checksum mismatch" in text, text
    for rank in (0, 1):
        summary = json.loads((out / f"rank{rank}.json").read_text())
        assert summary["restored_from"] == "memory" and summary["resumed_from"] == newest - 1, (rank, summary)
    assert f"restored step {newest - 1} from memory" in text and "newer steps passed over on every rank" in text, text


# ------------------------------------------------------------------ the numpy example, 2 ranks

EXAMPLE_STEPS = 40


def example_args(tmp: Path, *extra: str) -> list[str]:
    return ["--nproc-per-node", "2", str(EXAMPLE), "--steps", str(EXAMPLE_STEPS), "--ckpt-every", "5",
            "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out"), "--step-sleep", "0.01", *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The example's parameters without a fault (each rank alone, plain python: they never talk)."""
    tmp = tmp_path_factory.mktemp("reference")
    params = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank)}
        env.pop("TASKD_SNAPSHOT_DIR", None)
        subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(EXAMPLE_STEPS), "--ckpt-every", "5",
                        "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out")], env=env, check=True,
                       timeout=120)
        params.append(np.load(tmp / "out" / f"rank{rank}.npy").tobytes())
    return params


def example_result(tmp: Path, rank: int) -> tuple[dict, bytes]:
    out = tmp / "out"
    return json.loads((out / f"rank{rank}.json").read_text()), np.load(out / f"rank{rank}.npy").tobytes()


def test_a_snapshot_torn_inside_its_copy_is_never_restored(tmp_path: Path, reference: list[bytes]) -> None:
    job, log = new_job("torn"), tmp_path / "console.log"
    proc = taskd_run(job, example_args(tmp_path), log, {"TASKD_SNAPSHOT_FAULT": "kill-in-copy:1:12"})
    text = finish(proc, log, job)
    assert "SIGKILL inside the copy of step 12" in text and "fault: rank 1" in text, text
    summary, params = example_result(tmp_path, 1)
    assert summary["restored_from"] == "memory" and summary["resumed_from"] == 11, summary
    assert params == reference[1]


def test_a_cap_too_small_falls_back_to_disk_and_says_so(tmp_path: Path, reference: list[bytes]) -> None:
    job, log = new_job("cap"), tmp_path / "console.log"
    proc = taskd_run(job, example_args(tmp_path, "--crash-once-at-step", "12"), log,
                     {"TASKD_SNAPSHOT_MEMORY": "1000"})
    text = finish(proc, log, job)
    assert "snapshots off: the snapshot of step 1 is" in text, text
    assert f"a restart falls back to the disk checkpoints in {tmp_path / 'ckpt' / 'rank1'}" in text, text
    summary, params = example_result(tmp_path, 1)
    assert summary["restored_from"] == "disk" and summary["resumed_from"] == 10, summary
    assert params == reference[1]


def _own_shm() -> str | None:
    """Why this machine cannot give a job a /dev/shm of its own (a tmpfs in a private mount namespace), or None."""
    try:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare: {exc}"
    return None if probe.returncode == 0 else f"unshare -rm + mount tmpfs: {probe.stderr.strip()}"


def test_a_full_dev_shm_falls_back_to_disk_and_says_so(tmp_path: Path) -> None:
    """A real full /dev/shm: the job runs in a mount namespace of its own whose /dev/shm is a 64 KiB tmpfs, and
    each rank's state (20,000 doubles, 0.2 MB) does not fit. The cap (64 MB) is not what refuses it: the
    filesystem is (ENOSPC from posix_fallocate). Every rank says so and names its fallback; the job goes on,
    and the rank killed at step 12 resumes from its disk checkpoint of step 10, bit-identical."""
    why = _own_shm()
    if why is not None:
        pytest.skip(f"no private /dev/shm here ({why})")
    args = ["--steps", "15", "--ckpt-every", "5", "--dim", "20000", "--lr", "0.001"]
    ref_env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1"}
    ref_env.pop("TASKD_SNAPSHOT_DIR", None)
    subprocess.run([sys.executable, str(EXAMPLE), *args, "--ckpt-dir", str(tmp_path / "ref-ckpt"),
                    "--out", str(tmp_path / "ref")], env=ref_env, check=True, timeout=120)
    job, log = new_job("fullshm"), tmp_path / "console.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TASKD_SNAPSHOT_MEMORY": "64M"}
    for var in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_SNAPSHOT_FAULT"):
        env.pop(var, None)
    proc = subprocess.Popen(
        ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"', "sh",
         sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--job-id", job, "--nproc-per-node", "2",
         str(EXAMPLE), *args, "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
         "--crash-once-at-step", "12"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(proc)
    text = finish(proc, log, job, timeout=120)
    assert "more than the 65536 bytes free in /dev/shm" in text, text
    for rank in (0, 1):
        assert (f"rank {rank}: snapshots off: /dev/shm/taskd-snap-{job}-" in text
                and "is full: a snapshot of 0.2 MB does not fit in the 0.1 MB left of its 0.1 MB; a restart falls "
                f"back to the disk checkpoints in {tmp_path / 'ckpt' / f'rank{rank}'}" in text), text
    summary, params = example_result(tmp_path, 1)
    assert summary["restored_from"] == "disk" and summary["resumed_from"] == 10, summary
    assert params == np.load(tmp_path / "ref" / "rank1.npy").tobytes()


def test_a_sigkilled_agents_segments_are_removed_by_the_next_start(tmp_path: Path) -> None:
    job, log = new_job("agentkill"), tmp_path / "console.log"
    proc = taskd_run(job, ["--nproc-per-node", "2", str(EXAMPLE), "--steps", "100000", "--ckpt-every", "1000",
                           "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
                           "--step-sleep", "0.01"], log)
    left = wait_for(lambda: [d for d in job_dirs(job) if glob.glob(os.path.join(d, "rank1", "s*.snap"))], 60,
                    "rank 1's first published snapshot")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.isdir(left[0]), "a SIGKILLed agent cannot clean up: its directory stays until the next start"
    nxt, log2 = new_job("next"), tmp_path / "next.log"
    proc2 = taskd_run(nxt, ["--nproc-per-node", "1", str(EXAMPLE), "--steps", "2", "--ckpt-every", "1",
                            "--ckpt-dir", str(tmp_path / "ckpt2"), "--out", str(tmp_path / "out2")], log2)
    finish(proc2, log2, nxt)
    assert job_dirs(job) == [], "the next start on the node removes the SIGKILLed agent's snapshots"
