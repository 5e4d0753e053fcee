"""Snapshots persisted by the agent (issue 33, item 5), under real `taskd run`s with 2 ranks:

- every N steps (and the newest at the job's end) each rank's copy is on disk, intact and loadable, no temporary
  file is left, nothing of the job stays in /dev/shm; a disk that takes 2 s per fsync never slows a save();
- a new `taskd run` of the job after its end starts from the persisted copies, skipping a torn one and the
  temporary file a killed agent left, and ends bit-identical to a run that never stopped; when one rank's copy
  of the newest step fails only its checksum, every rank restores the older step, and the line says why.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
from support import STARTED, secret_file

from taskd.worker.snapshot_segment import load

ROOT = Path(__file__).resolve().parents[3]
JOB = Path(__file__).resolve().parent / "persist_job.py"
sys.path.insert(0, str(JOB.parent))
from persist_job import SIZE, update  # noqa: E402


def run_job(tmp: Path, name: str, steps: int, *flags: str, env: dict[str, str] | None = None,
            step_sleep: float = 0.02, job_args: tuple[str, ...] = ()) -> str:
    job = f"{name}-{uuid.uuid4().hex[:8]}"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for var in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_SNAPSHOT_MEMORY", "TASKD_SNAPSHOT_PERSIST_DIR",
                "TASKD_SNAPSHOT_PERSIST_EVERY", "TASKD_SNAPSHOT_PERSIST_KEEP", "TASKD_SNAPSHOT_PERSIST_FAULT"):
        if var not in (env or {}):
            full_env.pop(var, None)
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--job-id", job,
                             "--nproc-per-node", "2", *flags, str(JOB), "--steps", str(steps), "--out",
                             str(tmp / name), "--step-sleep", str(step_sleep), *job_args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    STARTED.append(proc)
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert glob.glob(f"/dev/shm/taskd-snap-{job}-*") == [], "the job's end must leave nothing in /dev/shm"
    return log.read_text()


def summary(tmp: Path, name: str, rank: int) -> dict:
    return json.loads((tmp / name / f"rank{rank}.json").read_text())


def expected(rank: int, steps: int) -> bytes:
    w = np.zeros(SIZE)
    for step in range(steps):
        w = update(w, rank, step)
    return w.tobytes()


def persisted(where: Path, rank: int) -> list[int]:
    return sorted(int(p.name[1:13]) for p in (where / f"rank{rank}").glob("s*.snap"))


def test_persisted_every_n_steps_intact_and_a_save_never_waits_on_the_disk(tmp_path: Path) -> None:
    where = tmp_path / "persist"
    # 60 steps of 0.1 s: the agent's copies (at a lower CPU priority) run while the ranks do. Its thread can starve
    # on loaded cores (an agent SIGSTOPped for the ranks' 6 s persisted step 60 alone), so the ranks wait at step 10
    # for its copy: two copies at least, however loaded, paced by the copy and not the clock
    text = run_job(tmp_path, "slow", 60, "--snapshot-persist-dir", str(where), "--snapshot-persist-every", "10",
                   "--snapshot-persist-keep", "6", step_sleep=0.1,
                   env={"TASKD_SNAPSHOT_PERSIST_FAULT": "slow-disk:2"}, job_args=("--wait-persisted", "10"))
    assert "persisted the snapshots of step 60 (2 ranks, 16.8 MB)" in text, text
    for rank in (0, 1):
        steps = persisted(where, rank)  # one per 10 steps: the multiple, or the first step after it the agent saw
        assert 10 <= steps[0] and steps[-1] == 60 and len({s // 10 for s in steps}) == len(steps) >= 2, steps
        for step in steps:
            state, _size = load(str(where / f"rank{rank}" / f"s{step:012d}.snap"), step, rank)
            assert state["step"] == step and state["w"].tobytes() == expected(rank, step)
        assert [p.name for p in (where / f"rank{rank}").iterdir() if not p.name.endswith(".snap")] == []
        saves = summary(tmp_path, "slow", rank)["saves"]
        assert len(saves) == 60 and max(saves) < 1.0, f"a save() waited on the 2 s fsyncs: {max(saves):.3f} s"


def test_save_costs_the_same_with_the_agent_persisting_every_step(tmp_path: Path) -> None:
    run_job(tmp_path, "without", 40)
    run_job(tmp_path, "with", 40, "--snapshot-persist-dir", str(tmp_path / "p2"), "--snapshot-persist-every", "1")
    medians = {name: statistics.median(summary(tmp_path, name, 0)["saves"] + summary(tmp_path, name, 1)["saves"])
               for name in ("without", "with")}
    print(f"save() median of an 8 MB state, 2 ranks: {medians['without'] * 1e3:.1f} ms without persistence, "
          f"{medians['with'] * 1e3:.1f} ms persisting every step")
    assert medians["with"] < 2 * medians["without"] + 0.02, medians


def test_a_rerun_after_the_job_ended_starts_from_the_persisted_copies_never_a_torn_or_a_bad_one(tmp_path: Path) -> None:
    where = tmp_path / "persist"
    flags = ("--snapshot-persist-dir", str(where), "--snapshot-persist-every", "10")
    run_job(tmp_path, "first", 30, *flags, job_args=("--wait-persisted", "10,20"))  # paced by the copies, not the clock
    steps = persisted(where, 0)
    assert persisted(where, 1) == steps == [10, 20, 30], steps  # the end: its newest
    torn = where / "rank1" / f"s{30:012d}.snap"
    os.truncate(torn, torn.stat().st_size // 2)  # a copy cut short under its step's name: never restored
    killed = where / "rank0" / f".s40.{2 ** 22 + 7}.deadbeef.tmp"  # what an agent SIGKILLed mid-copy leaves
    killed.write_bytes(b"half a copy")

    text = run_job(tmp_path, "again", 40, *flags)
    for rank in (0, 1):
        got = summary(tmp_path, "again", rank)
        assert got["resumed_from"] == steps[-2] and got["restored_from"] == "persisted", got  # not the torn 30
        assert np.load(tmp_path / "again" / f"rank{rank}.npy").tobytes() == expected(rank, 40)
    assert f"rank 1 restored step {steps[-2]} from the persisted snapshots in {where}" in text, text
    assert not killed.exists(), "the next agent removes a dead agent's temporary copy"
    steps = persisted(where, 0)
    assert persisted(where, 1) == steps and len(steps) >= 2 and steps[-1] == 40, steps

    # one rank's copy of the newest step whole but one byte off (it fails only its checksum): every rank passes
    # over that step together, never rank 1 alone (a mix of steps)
    flipped = where / "rank1" / f"s{40:012d}.snap"
    with flipped.open("r+b") as fh:
        fh.seek(flipped.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    size = flipped.stat().st_size  # rank 1's torn 30 may still be there (unless the last run persisted 30 again)
    older = max(s for s in steps[:-1] if (where / "rank1" / f"s{s:012d}.snap").stat().st_size == size)
    text = run_job(tmp_path, "third", 44, *flags)
    for rank in (0, 1):
        got = summary(tmp_path, "third", rank)
        assert got["resumed_from"] == older and got["restored_from"] == "persisted", got
        assert np.load(tmp_path / "third" / f"rank{rank}.npy").tobytes() == expected(rank, 44)
        assert (f"rank {rank} restored step {older} from the persisted snapshots in {where}" in text
                and "newer persisted steps passed over on every rank: step 40: rank 1's copy " in text), text
    assert "checksum mismatch" in text and Path(f"{flipped}.corrupt").exists(), text


def two_free_ports() -> int:
    """A port PORT with PORT + 1 free too (the endpoint, and node 0's controller beside it)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


def run_two_nodes(tmp: Path, name: str, steps: int, where: Path, *job_args: str) -> str:
    """One job on two nodes (two `taskd run`s on loopback, one rank each; node 0 hosts the controller), its ranks
    persisted to ``where`` by each node's agent; the consoles."""
    port, job = two_free_ports(), f"{name}-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_", "TORCHELASTIC_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    token = secret_file(tmp / "token", "s3cret-of-both-nodes-0123456789")
    env.update(PYTHONPATH=str(ROOT), TASKD_TOKEN_FILE=str(token))
    procs = []
    for node in (0, 1):
        log = tmp / f"{name}-node{node}.log"
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
             job, "--snapshot-persist-dir", str(where), "--snapshot-persist-every", "10", str(JOB), "--steps",
             str(steps), "--out", str(tmp / name), *job_args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
            cwd=ROOT, start_new_session=True), log))
        STARTED.append(procs[-1][0])
    for proc, log in procs:
        assert proc.wait(timeout=120) == 0, log.read_text()
    return "".join(log.read_text() for _proc, log in procs)


def test_a_two_node_job_persists_each_nodes_ranks_and_a_rerun_resumes_from_them(tmp_path: Path) -> None:
    """Each node's agent persists its own rank into the shared directory: after the job it holds the same steps
    for both ranks, intact; a new two-node run of the job starts both ranks from the newest and ends bit-identical
    to a run that never stopped."""
    where = tmp_path / "persist"
    text = run_two_nodes(tmp_path, "first", 20, where, "--wait-persisted", "10")  # paced by the copy of step 10
    assert text.count("persisted the snapshots of step 20 (1 ranks") == 2, text  # each node its own rank
    assert persisted(where, 0) == persisted(where, 1) == [10, 20]
    for rank in (0, 1):
        state, _size = load(str(where / f"rank{rank}" / f"s{20:012d}.snap"), 20, rank)
        assert state["w"].tobytes() == expected(rank, 20)
    text = run_two_nodes(tmp_path, "again", 24, where)
    for rank in (0, 1):
        got = summary(tmp_path, "again", rank)
        assert got["resumed_from"] == 20 and got["restored_from"] == "persisted", (got, text)
        assert np.load(tmp_path / "again" / f"rank{rank}.npy").tobytes() == expected(rank, 24)
