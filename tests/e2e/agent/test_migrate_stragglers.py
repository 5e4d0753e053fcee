"""`taskd run --straggler-factor F --migrate-stragglers`: a straggler moves to a warm spare (issue 34, item 4).

Two 2-rank DDP LiveGroup jobs (examples/torch/train_ddp.py, gloo, CPU) run side by side against one `taskd server`:
`even`, the reference, and `slow`, with `--straggler-factor 3 --migrate-stragglers`, whose rank 1 sleeps 0.8 s more
per step outside collectives in the process started with the job only (`--slow 1:0.8 --slow-process`: a slow
device, which a new process leaves behind), 5x its peer's 0.2 s. The slow job's agent moves rank 1 to its warm
spare, once; its step rate afterwards is compared with the even job's over the same seconds on the same machine
(within 10 %, each at its median step interval); no step is redone or lost, the final parameters are
bit-identical to the even job's, each decision is one job event with its trigger, nothing is left.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import ROOT, leftovers, wait_for  # noqa: E402
from support.restartable import server, status  # noqa: E402
from support.run import taskd_run  # noqa: E402

pytestmark = pytest.mark.torch

EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
STEPS = 400  # the even job (4 steps/s while paced) is still paced when the slow one has moved
SLEEP = 0.2  # every rank's step (outside collectives); the slow one's 0.8 s more: 5x


def job(tmp: Path, address: str, name: str, slow: bool):  # noqa: ANN201 - a Popen
    """The job, paced (SLEEP a step) while `tmp`/`name`.pace exists; removing the file lets it finish at full speed."""
    (tmp / f"{name}.pace").touch()
    moves = ["--straggler-factor", "3", "--straggler-interval", "1", "--migrate-stragglers"] if slow else []
    args = ["--server", address, "--nproc-per-node", "2", "--job-id", name, "--stop-grace", "2", "--warm-spares", "1",
            *moves, str(EXAMPLE),
            "--hidden", "32", "--layers", "1", "--inputs", "32", "--batch", "8", "--steps", str(STEPS),
            "--ckpt-every", "0", "--step-sleep", str(SLEEP), "--sleep-while", str(tmp / f"{name}.pace"),
            "--pg-timeout", "30", "--ckpt-dir", str(tmp / name / "ckpt"), "--out", str(tmp / name / "out"),
            "--progress-dir", str(tmp / name / "progress"),
            *(["--slow", f"1:{4 * SLEEP}", "--slow-process"] if slow else [])]
    return taskd_run(args, tmp / f"{name}.log", env={"OMP_NUM_THREADS": "1"})


def progress(tmp: Path, name: str, rank: int) -> list[tuple[int, float, int]]:
    """(step, time, pid) of every step the rank completed, in order, over its processes."""
    path = tmp / name / "progress" / f"rank{rank}.progress"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(s), float(t), int(p)) for s, t, p in (line.split() for line in lines if line.count(" ") == 2)]


def steps_between(tmp: Path, name: str, start: float, end: float) -> list[float]:
    """When rank 0 completed each step in [start, end)."""
    return [t for _, t, _ in progress(tmp, name, 0) if start <= t < end]


def rate(times: list[float]) -> float:
    """Steps per second at the median step interval: what the job does between the shared machine's stalls (another
    job's spare importing torch stalls one job's step for 0.5 s now and then; measured, both jobs)."""
    return 1 / statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def test_a_straggler_moves_to_a_warm_spare_once_and_the_job_keeps_pace(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with server(tmp_path) as srv:
        even = job(tmp_path, srv.address, "even", slow=False)
        slow = job(tmp_path, srv.address, "slow", slow=True)
        log = tmp_path / "slow.log"
        moved = wait_for(lambda: re.search(r"migrated rank 1 \(pid (\d+) -> (\d+)\) at step (\d+)", log.read_text())
                         or slow.poll(), 180, "the straggler's move", interval=0.2)
        assert isinstance(moved, re.Match), log.read_text()[-6000:]
        print(f"moved {time.monotonic() - t0:.1f}s after the start")
        assert "--migrate-stragglers: rank 1 has been a straggler" in log.read_text()
        # the rates, side by side over the same seconds, once the successor trained a few steps
        wait_for(lambda: sum(p == int(moved.group(2)) for *_, p in progress(tmp_path, "slow", 1)) >= 5, 60,
                 "the successor's first steps")
        start = time.time()
        wait_for(lambda: time.time() - start >= 8 and min(len(steps_between(tmp_path, name, start, time.time()))
                                                          for name in ("even", "slow")) >= 30, 120,
                 "30 steps of each job", interval=0.2)
        end = time.time()
        assert all(progress(tmp_path, name, 0)[-1][0] < STEPS - 1 for name in ("even", "slow")), "a job ended"
        rates = {name: rate(steps_between(tmp_path, name, start, end)) for name in ("even", "slow")}
        means = {name: (len(t) - 1) / (t[-1] - t[0])
                 for name in rates for t in [steps_between(tmp_path, name, start, end)]}
        print(f"steps/s over {end - start:.1f}s after the move: at the median interval {rates}, mean {means}")
        assert abs(rates["slow"] / rates["even"] - 1) <= 0.10, rates  # had it stayed, 5x: 75 % slower
        for name in ("even", "slow"):
            (tmp_path / f"{name}.pace").unlink()
        for name, proc in (("even", even), ("slow", slow)):
            assert proc.wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()[-6000:]
        print(f"ended {time.monotonic() - t0:.1f}s after the start")
        events = {name: [e for e in status(srv.address, name)["events"]
                         if e["kind"] in ("migrated", "migration_failed")] for name in ("even", "slow")}
    assert not events["even"], events
    done = [e["detail"] for e in events["slow"] if e["kind"] == "migrated"]
    assert len(done) == 1 and done[0]["rank"] == 1 and done[0]["trigger"] == "straggler", events
    assert all(e["detail"]["trigger"] == "straggler" for e in events["slow"]), events
    pids = {r: [p for *_, p in progress(tmp_path, "slow", r)] for r in (0, 1)}
    assert len(set(pids[0])) == 1 and len(set(pids[1])) == 2, "rank 0 kept its process, rank 1 moved once"
    for r in (0, 1):
        assert [s for s, *_ in progress(tmp_path, "slow", r)] == list(range(STEPS)), f"rank {r} redid or lost steps"
    ref = torch.load(tmp_path / "even" / "out" / "final.pt")
    final = torch.load(tmp_path / "slow" / "out" / "final.pt")
    assert ref.keys() == final.keys() and all(torch.equal(ref[k], final[k]) for k in ref)
    assert not leftovers(str(tmp_path / "slow" / "out")), "a process of the job is left"
