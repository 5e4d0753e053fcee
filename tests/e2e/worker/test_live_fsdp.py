"""FSDP2 (`fully_shard`) inside `LiveGroup`.

Issue 34, item 2: with ``LiveGroup(snapshot_every=k)`` a pure FSDP2 job's killed rank alone is replaced under
`taskd run`; the replacement restores its shards from the snapshot its predecessor left in the node's memory, the
survivors keep their processes and roll their shards back to the same step, at most k steps redone. Without
snapshots (issue 21, D7) it says at `track()` that no live path exists, so the first fault takes job-rescheduling
at once (a recover that could not work failed after 175 s, 260 steps redone)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support.run import computed_steps, taskd_run, wait_ok  # noqa: E402

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_fsdp2_live.py"
STEPS, KILL_RANK, KILL_AT, EVERY = 4, 1, 2, 1
TIMEOUT = 150.0


def start(tmp: Path, name: str, extra: list[str], flags: list[str] = ()) -> tuple[subprocess.Popen, Path]:
    (tmp / name).mkdir(parents=True)
    argv = ["--nproc-per-node", "4", *flags, str(EXAMPLE), "--steps", str(STEPS), "--snapshot-every", str(EVERY),
            "--pg-timeout", "30", "--out", str(tmp / name / "out"), *extra]
    log = tmp / name / "console.log"
    return taskd_run(argv, log, env={"OMP_NUM_THREADS": "1"}), log


def finish(proc: subprocess.Popen, log: Path) -> str:
    return wait_ok(proc, log, TIMEOUT)


steps_done = computed_steps


def test_a_killed_fsdp2_rank_alone_is_replaced_and_every_rank_rolls_back_to_its_snapshot(tmp_path: Path) -> None:
    faulty, faulty_log = start(tmp_path, "faulty", ["--kill-rank", str(KILL_RANK), "--kill-at-step", str(KILL_AT)],
                               flags=["--warm-spares", "1", "--warm-spare-mode", "script"])
    reference, reference_log = start(tmp_path, "reference", [])
    console = finish(faulty, faulty_log)
    finish(reference, reference_log)
    pids = {int(r): int(p) for r, p in re.findall(r"(\d+):(\d+)", re.search(
        r"started 4 rank\(s\) \(rank:pid ([0-9:, ]+)\)", console).group(1))}
    said = "live recovery for this job: FSDP2 over 4 ranks"
    assert said in console and console.index(said) < console.index("fault: rank 1"), console[-6000:]
    assert "strategy: recover for rank(s) [1]" in console and "job-rescheduling" not in console, console[-6000:]
    out, ref = tmp_path / "faulty" / "out", tmp_path / "reference" / "out"
    killed_at = float((out / "killed_once").read_text().split()[1])
    resumed = []
    for rank in range(4):
        done = steps_done(out, rank)
        # the killed rank updated step KILL_AT but never snapshotted it, the others went on into KILL_AT + 1: every
        # rank rolls back to the newest step all hold in memory, KILL_AT, and redoes it (EVERY = 1 step)
        assert [s for s, _, _ in done] == [*range(KILL_AT + 1), *range(KILL_AT, STEPS)], f"rank {rank}: {done}"
        if rank != KILL_RANK:  # the survivors kept their processes
            assert {p for _, _, p in done} == {pids[rank]}, (rank, done, pids)
        else:
            assert done[KILL_AT][2] == pids[rank] and done[KILL_AT + 1][2] != pids[rank], done
        resumed.append(done[KILL_AT + 2][1] - killed_at)  # past the redone step and the next one
        mine, theirs = torch.load(out / f"rank{rank}.pt"), torch.load(ref / f"rank{rank}.pt")
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), f"rank {rank} {key}: {(mine[key] - theirs[key]).abs().max()}"
    assert not Path(f"/proc/{pids[KILL_RANK]}").exists()  # the killed process is gone, reaped
    print(f"FSDP2 x4, k={EVERY}, rank {KILL_RANK} SIGKILLed after its update of step {KILL_AT}: every rank past "
          f"step {KILL_AT + 1} {max(resumed):.3f}s after the kill (per rank {[round(r, 3) for r in resumed]}), "
          f"1 step redone, load {os.getloadavg()[0]:.1f}")


def test_fsdp2_without_snapshots_says_so_at_the_start_and_its_fault_takes_job_rescheduling(tmp_path: Path) -> None:
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
    assert "LiveGroup(snapshot_every=k) would replace a lost rank alone" in console, console[-4000:]
    assert "strategy: job-rescheduling" in console and "strategy: recover" not in console, console[-4000:]
    assert took < 100, f"{took:.0f}s"


def test_a_rank_lost_before_its_first_snapshot_is_refused_in_one_line_and_takes_job_rescheduling(
        tmp_path: Path) -> None:
    """The give-up path: rank 1 dies after its update of step 0, before any snapshot of its shards, so no step is
    held by every rank (the survivor holds step 1, the replacement nothing): every rank of the re-formed group exits
    cleanly, rank 0 says why in one line, and the round goes on to job-rescheduling (a fresh start here)."""
    proc = taskd_run(["--nproc-per-node", "2", str(EXAMPLE), "--steps", "2", "--snapshot-every", "1", "--pg-timeout",
                      "30", "--hidden", "16", "--layers", "1", "--out", str(tmp_path / "out"), "--kill-rank", "1",
                      "--kill-at-step", "0"], tmp_path / "console.log", env={"OMP_NUM_THREADS": "1"})
    console = wait_ok(proc, tmp_path / "console.log", TIMEOUT)
    said = ("live recovery refused: rank(s) 1 hold no snapshot in memory (neither their node's segments nor a copy "
            "fetched from the buddy node), so the shards they held are lost; every rank exits (code 76)")
    assert console.count(said) == 1 and "Traceback" not in console, console[-6000:]
    assert console.index("strategy: recover for rank(s) [1]") < console.index(said) \
        < console.index("strategy: job-rescheduling"), console[-6000:]
    # the refusal is no fault: its event line and the summary say so (the SIGKILL is the job's one fault)
    assert re.search(r"refusal: rank [01] \(pid \d+\) refused live recovery: the shards it would need are lost "
                     r"\(exit 76\)", console) and "exited with code 76" not in console, console[-6000:]
    assert re.search(r"job succeeded[^:\n]*: 2 ranks, 1 fault\(s\), [12] rank\(s\) refused live recovery \(shards "
                     r"lost\), ", console), console[-6000:]
    for rank in range(2):  # restarted from scratch (no checkpoints): step 0 by the first processes, then 0 and 1
        assert [s for s, _, _ in steps_done(tmp_path / "out", rank)] == [0, 0, 1], (rank, console[-6000:])
