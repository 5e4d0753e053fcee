"""`taskd migrate` of one rank of a 2 x 2 HSDP LiveGroup job (examples/torch/train_hsdp.py: FSDP2 over replicate x
shard, gloo, CPU), against a real `taskd server` on loopback (issue 34, item 4).

The successor, a warm spare, receives the rank's shards (parameters, optimizer state) from the rank that holds the
same shards in the other replica group, in memory, at the step boundary the ranks agreed on. No step is redone or
lost, the other ranks keep their processes, the old process is gone, and every rank's final shards are
bit-identical to a fault-free run's (run alongside); the job event `migrated` says so; nothing is left.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import ROOT, leftovers, wait_for  # noqa: E402
from support.restartable import server, status  # noqa: E402
from support.run import computed_steps, taskd_run  # noqa: E402

pytestmark = pytest.mark.torch

EXAMPLE = ROOT / "examples" / "torch" / "train_hsdp.py"
STEPS, MOVED = 60, 1


def start(tmp: Path, name: str, flags: list[str], extra: list[str]) -> subprocess.Popen[bytes]:
    (tmp / name).mkdir()
    argv = ["--nproc-per-node", "4", "--job-id", name, "--stop-grace", "2", *flags, str(EXAMPLE), "--steps",
            str(STEPS), "--replicas", "2", "--hidden", "32", "--layers", "2", "--pg-timeout", "30", "--out",
            str(tmp / name / "out"), *extra]
    return taskd_run(argv, tmp / f"{name}.log", env={"OMP_NUM_THREADS": "1"})


def steps_done(tmp: Path, name: str, rank: int) -> list[tuple[int, int]]:
    """(step, pid) of each step the rank completed, by every process that was that rank."""
    return [(s, p) for s, _, p in computed_steps(tmp / name / "out", rank)]


def migrate(address: str, job: str, rank: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskd", "migrate", "--server", address, "--job", job, "--rank",
                           str(rank), "--timeout", "100"], capture_output=True, text=True, timeout=150, cwd=ROOT)


def moved(address: str, job: str, log: Path) -> subprocess.CompletedProcess[str] | None:
    """A `taskd migrate` that moved the rank; None while the node's warm spare is not ready yet."""
    done = migrate(address, job, MOVED)
    if done.returncode == 0:
        return done
    assert "no warm spare is ready" in done.stderr, f"{done}\n{log.read_text()[-6000:]}"
    time.sleep(0.5)
    return None


def test_migrate_a_rank_of_a_live_hsdp_job(tmp_path: Path) -> None:
    pace = tmp_path / "pace"
    pace.touch()
    with server(tmp_path) as srv:
        ref = start(tmp_path, "ref", [], [])
        log = tmp_path / "mig.log"
        job = start(tmp_path, "mig", ["--server", srv.address, "--warm-spares", "1"],
                    ["--step-sleep", "0.2", "--sleep-while", str(pace)])
        wait_for(lambda: all(len(steps_done(tmp_path, "mig", r)) >= 3 for r in range(4)), 120, "the first steps",
                 interval=0.2)
        pids = {r: steps_done(tmp_path, "mig", r)[0][1] for r in range(4)}
        done = wait_for(lambda: moved(srv.address, "mig", log), 120, "a migration with a ready spare")
        assert f"migrated rank {MOVED} of job mig (pid {pids[MOVED]} -> " in done.stdout, done
        print(done.stdout)
        pace.unlink()
        for proc, name in ((ref, "ref"), (job, "mig")):
            assert proc.wait(timeout=150) == 0, (tmp_path / f"{name}.log").read_text()[-6000:]
        events = [e for e in status(srv.address, "mig")["events"] if e["kind"] in ("migrated", "migration_failed")]
    [event] = events
    assert event["kind"] == "migrated" and event["detail"]["old_pid"] == pids[MOVED], events
    for r in range(4):
        done_steps = steps_done(tmp_path, "mig", r)
        assert [s for s, _ in done_steps] == list(range(STEPS)), f"rank {r} redid or lost steps: {done_steps}"
        procs = [p for _, p in done_steps]
        assert procs[0] == pids[r] and len(set(procs)) == (2 if r == MOVED else 1), (r, procs)
        mine = torch.load(tmp_path / "mig" / "out" / f"rank{r}.pt")
        theirs = torch.load(tmp_path / "ref" / "out" / f"rank{r}.pt")
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), f"rank {r}"
    assert not Path(f"/proc/{pids[MOVED]}").exists(), "the old process is gone, reaped"
    assert not leftovers(str(tmp_path / "mig" / "out")), "a process of the job is left"
