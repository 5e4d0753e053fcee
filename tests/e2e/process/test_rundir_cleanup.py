"""Run directories SIGKILLed agents leave behind (`$TMPDIR/taskd-<job>-*`) are removed by the next `taskd run`.

Real `taskd run` processes in a private $TMPDIR: one is SIGKILLed (its ranks die with it), the next one
removes what it left, while a live agent's directory, a symlink, another user's directory and a
directory without an owner record (kept rank logs) stay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import STARTED, ranks_of, wait_for

from taskd.process.run_dir import OWNER_FILE, make_run_dir, owner_record, sweep_stale_run_dirs

ROOT = Path(__file__).resolve().parents[3]


def taskd_run(tmpdir: Path, job: str, script: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    env.pop("MINDX_SERVER_IP", None)
    env.pop("MINDX_TASK_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--job-id", job, "--nproc-per-node", "2",
                             "--monitor-interval", "0.2", str(script)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(proc)
    return proc


def run_dirs(tmpdir: Path, job: str) -> list[Path]:
    return sorted(p for p in tmpdir.glob(f"taskd-{job}-*") if p.is_dir() and not p.is_symlink())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def stale_dir(tmpdir: Path, name: str, **owner: object) -> Path:
    """A run directory as an agent that has died left it (a heartbeat file in it)."""
    path = tmpdir / name
    path.mkdir(mode=0o700)
    (path / "rank_0.hb").write_bytes(b"\0" * 16)
    (path / OWNER_FILE).write_text(json.dumps({**owner_record(), "pid": dead_pid(), **owner}))
    return path


def test_sigkilled_agent_leaves_its_run_dir_and_the_next_taskd_run_removes_it(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(300)\n")
    quick = tmp_path / "quick.py"
    quick.write_text("pass\n")

    killed = taskd_run(tmpdir, "killed", sleeper, tmp_path / "killed.log")
    wait_for(lambda: len(ranks_of(killed.pid)) == 2, 60, "the first job's 2 ranks")
    (left,) = run_dirs(tmpdir, "killed")
    assert json.loads((left / OWNER_FILE).read_text())["pid"] == killed.pid  # the agent records itself
    assert stat_mode(left) == 0o700
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert left.is_dir(), "a SIGKILLed agent cannot remove its run directory"

    live = taskd_run(tmpdir, "live", sleeper, tmp_path / "live.log")  # this start sweeps already
    wait_for(lambda: len(ranks_of(live.pid)) == 2, 60, "the live job's 2 ranks")
    assert not left.exists(), f"the stale run directory {left} is still there\n{(tmp_path / 'live.log').read_text()}"
    (live_dir,) = run_dirs(tmpdir, "live")

    kept_logs = tmpdir / "taskd-logs-kept"  # no owner record: rank logs torchrun-style, kept on purpose
    kept_logs.mkdir()
    (kept_logs / "rank_0.log").write_text("kept\n")
    second = stale_dir(tmpdir, "taskd-second-abc")
    done = taskd_run(tmpdir, "quick", quick, tmp_path / "quick.log")
    assert done.wait(timeout=120) == 0, (tmp_path / "quick.log").read_text()
    assert live_dir.is_dir(), "the run directory of a live agent was removed"
    assert kept_logs.is_dir() and not second.exists()
    assert run_dirs(tmpdir, "quick") == [], "a job that ended removes its own run directory"
    live.send_signal(signal.SIGTERM)
    assert live.wait(timeout=60) != 0
    assert not live_dir.exists(), "taskd run removes its own run directory when it ends"


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_only_dead_owners_dirs_of_this_user_are_removed_and_symlinks_never_followed(tmp_path: Path) -> None:
    mine = Path(make_run_dir("job", str(tmp_path)))  # this process is alive (first: making one sweeps)
    stale = stale_dir(tmp_path, "taskd-job-1")
    reused = stale_dir(tmp_path, "taskd-job-2", pid=os.getpid(), start="1")  # our pid, another start time
    other_host = stale_dir(tmp_path, "taskd-job-3", host="elsewhere")  # another host's pids mean nothing here
    other_ns = stale_dir(tmp_path, "taskd-job-4", pidns="pid:[1]")  # nor another PID namespace's
    not_ours = stale_dir(tmp_path, "other-job-5")  # not taskd's prefix
    target = stale_dir(tmp_path, "target")
    link = tmp_path / "taskd-job-6"
    link.symlink_to(target, target_is_directory=True)
    inner = stale_dir(tmp_path, "taskd-job-7")
    (inner / "escape").symlink_to(target, target_is_directory=True)  # removed as a link, not followed

    removed = sweep_stale_run_dirs(str(tmp_path))

    assert sorted(removed) == sorted(str(p) for p in (stale, reused, inner))
    for kept in (mine, other_host, other_ns, not_ours, target):
        assert kept.is_dir(), kept
    assert link.is_symlink() and (target / "rank_0.hb").exists() and (target / OWNER_FILE).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_dir_is_left_alone(tmp_path: Path) -> None:
    foreign = stale_dir(tmp_path, "taskd-job-9")
    os.chown(foreign, 65534, 65534)
    assert sweep_stale_run_dirs(str(tmp_path)) == []
    assert foreign.is_dir()


def test_unreadable_owner_records_are_left_alone(tmp_path: Path) -> None:
    garbage = tmp_path / "taskd-job-10"
    garbage.mkdir()
    (garbage / OWNER_FILE).write_text("not json")
    no_pid = stale_dir(tmp_path, "taskd-job-11", pid="x")
    fifo = tmp_path / "taskd-job-12"
    fifo.mkdir()
    os.mkfifo(fifo / OWNER_FILE)  # must not block the sweep
    assert sweep_stale_run_dirs(str(tmp_path)) == []
    assert garbage.is_dir() and no_pid.is_dir() and fifo.is_dir()
