"""MindSpore under real msrun with in-memory snapshots (issue 33): a rank SIGKILLed costs at most k steps.

examples/mindspore/train_dp.py with a disk checkpoint every 8 steps and `SnapshotCallback` every step (k=1):
rank 1 is SIGKILLed past step 5. taskd's msrun plugin reschedules the job; both ranks restore from the node's
memory (the plugin's snapshot directory, not the disk: the newest checkpoint would redo 5 steps or more),
redo at most one step each, end with the weights of a fault-free run, and leave nothing in /dev/shm; with
TASKD_SNAPSHOT_PERSIST_DIR set (msrun's way to set it) the plugin's agent persists their snapshots, the job
end's newest among them.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pytest
from test_msrun import (  # skips this module too when MindSpore or msrun is missing
    TRAIN_DP,
    jobs,  # noqa: F401 (a fixture)
    msrun_env,  # noqa: F401 (a fixture)
    wait_for,
)

from taskd.worker.snapshot_segment import load

pytestmark = pytest.mark.mindspore


def incarnations(timeline: Path) -> list[list[dict]]:
    """The rank's timeline (JSON lines, appended by each incarnation) split by pid, in order."""
    runs: list[list[dict]] = []
    for line in timeline.read_text().splitlines():
        mark = json.loads(line)
        if not runs or runs[-1][0]["pid"] != mark["pid"]:
            runs.append([])
        runs[-1].append(mark)
    return runs


def last_step(run: list[dict]) -> int:
    return max((m["step"] for m in run if m["what"] == "step"), default=0)


@pytest.mark.timeout(420)
def test_rank_sigkilled_under_msrun_restores_from_memory_at_most_one_step_redone(jobs, msrun_env,  # noqa: F811
                                                                                  tmp_path: Path) -> None:
    train = ["--steps", "16", "--ckpt-every", "8", "--ckpt-dir", "{dir}/ckpt", "--out", "{dir}/out"]
    persist = tmp_path / "persist"  # msrun's command line is not taskd's: persistence is set by the variables
    job = jobs("faulty", TRAIN_DP, [*train, "--snapshot-every", "1", "--timeline", "{dir}/timeline",
                                    "--step-sleep", "0.3"],
               {**msrun_env, "TASKD_SNAPSHOT_PERSIST_DIR": str(persist), "TASKD_SNAPSHOT_PERSIST_EVERY": "4"})
    timeline = job.dir / "timeline"
    victim = wait_for("rank 1 past step 5", lambda: (timeline / "1.jsonl").exists() and last_step(
        incarnations(timeline / "1.jsonl")[-1]) >= 5 and job.rank_process(1), 180, job)
    victim.kill()
    rc = job.wait(300)
    job.assert_plugin_in_control()
    assert rc == 0, f"msrun exited {rc} after rank 1 was killed\n{job.logs()}"
    assert "job-rescheduling" in job.output(), job.logs()
    job.assert_one_job_rescheduling()
    for rank in (0, 1):
        first, second = incarnations(timeline / f"{rank}.jsonl")
        stopped = last_step(first)
        resumed = next(m["step"] for m in second if m["what"] == "loaded")
        assert 5 <= resumed <= stopped and resumed < 8, (rank, stopped, resumed, job.logs())
        assert stopped - resumed <= 1, f"rank {rank} redid {stopped - resumed} steps (a snapshot every step)"
        log = (job.log_dir / f"worker_{rank}.log").read_text(errors="replace")
        assert f"rank {rank} resumed from step {resumed} (memory)" in log, job.logs()
    job.assert_nothing_left()
    assert glob.glob(f"/dev/shm/taskd-snap-msrun-{msrun_env['MINDX_TASK_ID']}-*") == [], "left in /dev/shm"
    for rank in (0, 1):  # the plugin's agent persisted the ranks' snapshots, the job end's newest among them
        steps = sorted(int(p.name[1:13]) for p in (persist / f"rank{rank}").glob("s*.snap"))
        assert steps and steps[-1] == 16 and all(0 < s <= 16 for s in steps), (rank, steps, job.logs())
        state, _size = load(str(persist / f"rank{rank}" / f"s{16:012d}.snap"), 16, rank)
        assert state, "an intact copy, loadable"

    reference = jobs("reference", TRAIN_DP, train, msrun_env)
    assert reference.wait(240) == 0, reference.logs()
    expected = np.load(reference.dir / "out" / "rank_0.npy")
    for rank in (0, 1):
        weights = np.load(job.dir / "out" / f"rank_{rank}.npy")
        assert np.array_equal(weights, expected), f"rank {rank}'s final weights differ from the fault-free run"
