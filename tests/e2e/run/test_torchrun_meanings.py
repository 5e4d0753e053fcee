"""torchrun's meanings where taskd's differed without reason (issue 32, items 7 and 8), with real `taskd run`s.

F7: `--standalone` picks its own port even when `--master-port` names a busy one (a notice says so).
F8: an error before any step, the same error at the same step twice, or a `LiveUsageError`, fails the job at
once with one root cause; a crash after progress is still recovered. F9: `--straggler-factor` says when the
ranks send no heartbeats. Item 8: a job that failed because a rank was SIGKILLed does not exit 137.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ROOT, STARTED

TIMEOUT = 120

PROBE = """
import os, sys
open(sys.argv[1], "w").write(os.environ["MASTER_PORT"])
"""


def run(args: list[str], cwd: Path, timeout: float = TIMEOUT) -> tuple[subprocess.CompletedProcess[str], float]:
    """`taskd run ARGS` in `cwd` (no cluster variables), its console, and how long it took."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "MINDX_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args], cwd=cwd,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None), time.monotonic() - started


def test_standalone_ignores_a_busy_master_port_as_torchrun_does(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    with socket.create_server(("", 0)) as taken:  # another job's store listens there
        busy = taken.getsockname()[1]
        done, _ = run(["--standalone", "--nproc-per-node", "1", "--master-port", str(busy), str(script),
                       str(tmp_path / "port")], tmp_path)
    assert done.returncode == 0, done.stdout
    assert f"--master-port {busy}: ignored with --standalone" in done.stdout, done.stdout
    port = int((tmp_path / "port").read_text())
    assert port != busy and port > 0


SLEEPER = """
import sys, time
from taskd import worker
for step in range(int(float(sys.argv[2]) / 0.05)):
    time.sleep(0.05)
    if sys.argv[1] == "beats":
        worker.heartbeat(step)
"""


def test_straggler_factor_says_once_when_the_ranks_send_no_heartbeats(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    flags = ["--nproc-per-node", "2", "--straggler-factor", "2", "--straggler-interval", "0.5", str(script)]
    blind, _ = run([*flags, "silent", "4"], tmp_path)
    assert blind.returncode == 0, blind.stdout
    # a 4 s job ends before the start grace (BLIND_START) of a longer one: it is told at its end
    said = [ln for ln in blind.stdout.splitlines() if "no rank reported a step" in ln]
    assert len(said) == 1 and "sends no heartbeats" in said[0] and "could be named" in said[0], blind.stdout
    seeing, _ = run([*flags, "beats", "4"], tmp_path)
    assert seeing.returncode == 0, seeing.stdout
    assert "no rank reported a step" not in seeing.stdout, seeing.stdout


RAISES = """
import os, sys, time
from pathlib import Path
runs = Path(sys.argv[1]); runs.mkdir(exist_ok=True)
rank, mode = int(os.environ["RANK"]), sys.argv[2]
(runs / f"rank{rank}-{os.getpid()}").touch()
if mode == "start":
    if rank == 1:
        raise ValueError("bad config: lr must be positive")
    time.sleep(30)
    sys.exit(0)
from taskd import worker
for step in range(8):
    worker.heartbeat(step)
    time.sleep(0.05)
    if rank == 1 and step == 4:
        crashes = len(list(runs.glob("crash*")))
        if mode == "every" or crashes == 0:
            (runs / f"crash{crashes}").touch()
            raise RuntimeError("step 4 diverged")
"""


def _bug_lines(console: str) -> list[str]:
    return [ln for ln in console.splitlines() if "] not restarted:" in ln]


def _rank_tracebacks(console: str) -> int:
    """Tracebacks the ranks printed (the job summary's quoted log tail, `  | `, is not one)."""
    return sum(1 for ln in console.splitlines() if ln.endswith("Traceback (most recent call last):")
               and "| Traceback" not in ln)


def test_a_script_raising_at_start_runs_once_and_fails_at_once(tmp_path: Path) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    done, took = run(["--nproc-per-node", "2", str(script), str(tmp_path / "runs"), "start"], tmp_path)
    console = done.stdout
    assert done.returncode == 1, console[-3000:]
    assert len(list((tmp_path / "runs").glob("rank1-*"))) == 1, console[-3000:]  # one start, no restart
    bug = _bug_lines(console)
    assert len(bug) == 1 and "rank 1 raised ValueError: bad config: lr must be positive" in bug[0], console[-3000:]
    assert "before any rank completed a step" in bug[0], bug
    assert "job FAILED (the script's own error, not restarted: rank 1 raised ValueError: bad config" in console
    assert _rank_tracebacks(console) == 1, console[-3000:]
    assert "restarted 2 rank(s)" not in console and "with job-rescheduling" not in console, console[-3000:]
    assert took < 20, f"{took:.1f}s"


def test_the_same_error_at_the_same_step_twice_fails_the_job(tmp_path: Path) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    done, _ = run(["--nproc-per-node", "2", str(script), str(tmp_path / "runs"), "every"], tmp_path)
    console = done.stdout
    assert done.returncode == 1, console[-3000:]
    assert len(list((tmp_path / "runs").glob("rank1-*"))) == 2, console[-3000:]  # one restart, not 3
    bug = _bug_lines(console)
    assert len(bug) == 1 and "RuntimeError: step 4 diverged (at step 4)" in bug[0], console[-3000:]
    assert "same error at the same step" in bug[0], bug


def test_an_error_after_progress_is_still_restarted(tmp_path: Path) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    done, _ = run(["--nproc-per-node", "2", str(script), str(tmp_path / "runs"), "once"], tmp_path)
    console = done.stdout
    assert done.returncode == 0, console[-3000:]
    assert not _bug_lines(console), console[-3000:]
    assert len(list((tmp_path / "runs").glob("rank1-*"))) == 2, console[-3000:]


LIVE_MISUSE = """\
import torch, torch.distributed as dist
from taskd.worker.torch import LiveGroup

live = LiveGroup(backend="gloo")
model = torch.nn.Linear(4, 1)
live.track(model=model)
newest = torch.tensor([0])
dist.all_reduce(newest, op=dist.ReduceOp.MIN)  # the script's own "newest common step": refused
for step in live.steps(int(newest), 3):
    with live.step():
        pass
live.close()
"""


def test_a_live_usage_error_fails_the_job_at_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "misuse.py"
    script.write_text(LIVE_MISUSE)
    done, _ = run(["--nproc-per-node", "2", str(script)], tmp_path, timeout=180)
    console = done.stdout
    # 106: the rank printed its traceback, then torch's gloo teardown aborted it (docs/pytorch.md)
    assert done.returncode in (1, 100 + signal.SIGABRT), console[-3000:]
    bug = _bug_lines(console)
    assert len(bug) == 1 and "LiveUsageError" in bug[0], console[-3000:]
    assert "restarted 2 rank(s)" not in console and "with recover" not in console, console[-3000:]
