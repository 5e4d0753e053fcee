"""`taskd migrate` of one rank of a 4-rank DDP LiveGroup job (examples/torch/train_ddp.py, gloo, CPU), against a real
`taskd server --token-file` on loopback (issue 34, item 4).

One job without a warm spare is the fault-free reference: `taskd migrate` is refused there (no spare, a bad
credential, an unknown rank), each time with its reason and a non-zero exit, and nothing changes (every rank keeps
its pid, no step is recomputed). The same job with `--warm-spares 1`: a first `taskd migrate` of rank 2 whose
successor is SIGKILLed before it is ready is called off (exit 1, nothing changed); the next, with the job's own
credential, moves it: the old process is gone, the other ranks keep their pids, no step is recomputed or lost, the
final parameters are bit-identical to the reference, the pause is in the job's events, and nothing is left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import ROOT, leftovers, secret_file, wait_for  # noqa: E402
from support.restartable import server  # noqa: E402
from support.run import taskd_run  # noqa: E402

pytestmark = pytest.mark.torch

EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
WORLD = 4
STEPS = 400
ADMIN = "migrate-test-admin-token-0123456789"


def job_args(tmp: Path, name: str) -> list[str]:
    """The job, paced (0.2 s a step, 80 s in all) while `tmp`/`name`.pace exists: the test acts on it meanwhile,
    and removes the file to let it finish at full speed."""
    (tmp / f"{name}.pace").touch()
    return ["--nproc-per-node", str(WORLD), "--job-id", name, "--stop-grace", "2", str(EXAMPLE), "--hidden", "32",
            "--layers", "2", "--inputs", "32", "--batch", "8", "--steps", str(STEPS), "--ckpt-every", "0",
            "--step-sleep", "0.2", "--sleep-while", str(tmp / f"{name}.pace"), "--pg-timeout", "30",
            "--ckpt-dir", str(tmp / name / "ckpt"), "--out", str(tmp / name / "out"),
            "--progress-dir", str(tmp / name / "progress")]


def progress(tmp: Path, name: str, rank: int) -> list[tuple[int, int]]:
    """(step, pid) of every step the rank completed, in order, over its incarnations."""
    path = tmp / name / "progress" / f"rank{rank}.progress"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(int(s), int(p)) for s, _, p in (line.split() for line in lines if line.count(" ") == 2)]


def migrate_call(address: str, job: str, rank: int, token: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "TASKD_TOKEN_FILE")}
    return subprocess.Popen([sys.executable, "-m", "taskd", "migrate", "--server", address, "--job", job, "--rank",
                             str(rank), "--token-file", str(token), "--timeout", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def migrate(address: str, job: str, rank: int, token: Path) -> subprocess.CompletedProcess[str]:
    call = migrate_call(address, job, rank, token)
    out, err = call.communicate(timeout=150)
    return subprocess.CompletedProcess(call.args, call.returncode, out, err)


def migrated(address: str, job: str, rank: int, token: Path, log: Path) -> subprocess.CompletedProcess[str] | None:
    """A `taskd migrate` that moved the rank; None while the node has no warm spare ready; else the test fails."""
    moved = migrate(address, job, rank, token)
    if moved.returncode == 0:
        return moved
    assert "no warm spare is ready" in moved.stderr, f"{moved}\n{log.read_text()[-4000:]}"
    time.sleep(0.5)
    return None


def started(tmp: Path, name: str) -> dict[int, int]:
    """Each rank's pid once every rank completed 5 steps."""
    wait_for(lambda: all(len(progress(tmp, name, r)) >= 5 for r in range(WORLD)), 120, f"{name}'s ranks to train")
    return {r: progress(tmp, name, r)[0][1] for r in range(WORLD)}


def finish(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end:\n{log.read_text()[-6000:]}")
    assert proc.returncode == 0, log.read_text()[-6000:]


def events(address: str, job: str, token: Path) -> dict[str, list[dict]]:
    """The job's migration events by kind (their details), as one `taskd status --json` shows them."""
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", job, "--json",
                          "--token-file", str(token)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out
    found: dict[str, list[dict]] = {"migrated": [], "migration_failed": []}
    for e in json.loads(out.stdout)["jobs"][0]["events"]:
        found.setdefault(e["kind"], []).append(e["detail"])
    return found


def test_migrate_a_rank_of_a_live_ddp_job(tmp_path: Path) -> None:
    admin = secret_file(tmp_path / "admin.token", ADMIN + "\n")
    wrong = secret_file(tmp_path / "wrong.token", "not-the-token\n")
    with server(tmp_path, ("--token-file", str(admin))) as srv:
        base = ["--server", srv.address, "--token-file", str(admin)]
        # both jobs run at once (paced, each acted on in turn): the reference's run is the mig job's wait to start
        ref_log = tmp_path / "ref.log"
        ref = taskd_run([*base, *job_args(tmp_path, "ref")], ref_log)
        credential = secret_file(tmp_path / "job.cred", subprocess.run(
            [sys.executable, "-m", "taskd", "token", "--job", "mig", "--token-file", str(admin)],
            capture_output=True, text=True, timeout=30, cwd=ROOT, check=True).stdout)
        log = tmp_path / "mig.log"
        job = taskd_run([*base, "--warm-spares", "1", *job_args(tmp_path, "mig")], log)

        # the reference: no warm spare, so every migration is refused and the job runs as it was
        before = started(tmp_path, "ref")
        refused = migrate(srv.address, "ref", 1, admin)
        assert refused.returncode == 1 and "no warm spare is ready" in refused.stderr, refused
        refused = migrate(srv.address, "ref", 1, wrong)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused
        refused = migrate(srv.address, "ref", WORLD, admin)
        assert refused.returncode == 1 and f"rank {WORLD} is not a rank of job ref" in refused.stderr, refused
        (tmp_path / "ref.pace").unlink()

        # the same job with a warm spare: rank 2 moves, with the job's own credential
        pids = started(tmp_path, "mig")
        # the successor dies before it is ready: the migration is called off and the job runs as it was
        call = migrate_call(srv.address, "mig", 2, credential)
        line = wait_for(lambda: re.search(r"successor pid (\d+) starting", log.read_text()), 60, "a successor")
        os.kill(int(line.group(1)), signal.SIGKILL)
        out, err = call.communicate(timeout=150)
        assert call.returncode == 1 and f"called off: the successor (pid {line.group(1)}) ended" in err, (out, err)
        # then, once the pool has a spare again (refilled 5 s later), the rank moves
        moved = wait_for(lambda: migrated(srv.address, "mig", 2, credential, log), 90, "a migration with a new spare")
        assert moved.returncode == 0, f"{moved}\n{log.read_text()[-6000:]}"
        assert f"(pid {pids[2]} -> " in moved.stdout, moved.stdout
        (tmp_path / "mig.pace").unlink()
        wait_for(lambda: not _alive(pids[2]), 30, "the migrated rank's old process to exit")
        finish(ref, ref_log)
        finish(job, log)
        for r in range(WORLD):
            steps = progress(tmp_path, "ref", r)
            assert [s for s, _ in steps] == list(range(STEPS)) and {p for _, p in steps} == {before[r]}
        ref_events = events(srv.address, "ref", admin)
        assert [e["rank"] for e in ref_events["migration_failed"]] == [1] and not ref_events["migrated"], ref_events
        console = log.read_text()
        mig_events = events(srv.address, "mig", admin)
        done = mig_events["migrated"]
        assert len(done) == 1 and done[0]["old_pid"] == pids[2] and done[0]["pause_seconds"] > 0, done
        failed = mig_events["migration_failed"]
        # killed as it starts: before it says it is ready, or (on a slow machine) just after, before the group re-formed
        assert re.search(r"ended before (it was ready|the group re-formed)", failed[0]["reason"]), failed

    for r in range(WORLD):
        steps = progress(tmp_path, "mig", r)
        assert [s for s, _ in steps] == list(range(STEPS)), f"rank {r} recomputed or skipped steps"
        if r != 2:
            assert {p for _, p in steps} == {pids[r]}, f"rank {r} changed its process"
    moved_pids = [p for _, p in progress(tmp_path, "mig", 2)]
    assert moved_pids[0] == pids[2] and moved_pids[-1] != pids[2] and len(set(moved_pids)) == 2
    ref_final = torch.load(tmp_path / "ref" / "out" / "final.pt")
    final = torch.load(tmp_path / "mig" / "out" / "final.pt")
    assert ref_final.keys() == final.keys()
    for key in ref_final:
        assert torch.equal(ref_final[key], final[key]), f"{key} differs from the fault-free run"
    assert "migrated rank 2 (pid" in console and "training paused" in console, console[-4000:]
    assert not leftovers(str(tmp_path / "mig" / "out")), "a process of the job is left"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
