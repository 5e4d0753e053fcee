"""`taskd server --resume-timeout`: how long a job caught mid-round waits for its agents after a restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from support.scripted_agent import ScriptedAgent

from taskd.launcher.spec import free_port

REPO = Path(__file__).resolve().parents[3]


def serve(state: Path, port: int, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", f"127.0.0.1:{port}",
                             "--state", str(state), "--keepalive-interval", "0.3", *flags],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the server prints its address once it serves; exits (EOF) otherwise
    assert "listening on" in line, proc.stderr.read() if proc.poll() is not None else line
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_job_caught_mid_round_goes_on_without_a_missing_agent_after_the_resume_timeout(tmp_path: Path) -> None:
    state, port = tmp_path / "ctl.sqlite3", free_port()
    addr = f"127.0.0.1:{port}"
    first = serve(state, port)
    try:
        agents = [ScriptedAgent(addr, "mid", n, 2).join() for n in range(2)]
        assert agents[1].fault({1: 1}).code == 0  # node 1 of 2, one rank each: rank 1
        for a in agents:
            a.expect("stopTrain")
        for a in agents:
            a.close()
    finally:
        stop(first)

    started = time.monotonic()
    second = serve(state, port, "--resume-timeout", "1")
    try:
        back = ScriptedAgent(addr, "mid", 0, 2)  # node 1 never comes back
        assert back.init().code == 0
        back.subscribe()
        sig = back.expect("stopTrain", timeout=30)  # the default (120 s) would not let this arrive in time
        assert time.monotonic() - started >= 1.0, "the round waited for node 1 for the resume timeout first"
        assert [f.rankId for f in sig.faultRanks] == ["1"]
        events = [e.kind for e in back.list_jobs("mid").jobs[0].events]
        assert "round_resumed" in events
        back.close()
    finally:
        stop(second)


def test_a_resume_timeout_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state",
                           str(tmp_path / "s.sqlite3"), "--resume-timeout", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--resume-timeout" in proc.stderr, proc.stderr
    assert not (tmp_path / "s.sqlite3").exists()
