"""`taskd status` reads a standalone job (issue 21, D9): a real `taskd run` with its embedded controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import wait_for
from support.run import ROOT, taskd_run

WAIT_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskd", "status", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)


def test_taskd_status_finds_this_users_standalone_run_without_flags(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "TASKD_TOKEN_FILE")}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    # a locator a SIGKILLed run left: its pid is gone
    (runtime / "taskd").mkdir(mode=0o700)
    stale = runtime / "taskd" / "999999999-1.json"
    stale.write_text(json.dumps({"address": "127.0.0.1:1", "token": "x", "pid": 999999999, "started": 1.0}))
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FILE)
    run = taskd_run(["--nproc-per-node", "2", "--job-id", "solo", str(script), str(tmp_path / "go")],
                    tmp_path / "run.log", env={"XDG_RUNTIME_DIR": str(runtime)})
    try:
        wait_for(lambda: "started 2 rank(s)" in (tmp_path / "run.log").read_text(), 60, "the ranks to start")
        shown = _status(env, "--json")
        assert shown.returncode == 0, shown.stderr
        jobs = json.loads(shown.stdout)["jobs"]
        assert [(j["jobId"], j["state"]) for j in jobs] == [("solo", "RUNNING")], shown.stdout
        assert not stale.exists()  # pruned by the reader
        text = _status(env, "--job", "solo")
        assert text.returncode == 0 and "job solo: RUNNING" in text.stdout, text.stdout + text.stderr
        other = _status(env, "--job", "other")
        assert other.returncode == 1 and "no job 'other'" in other.stdout, other.stdout
        locators = list((runtime / "taskd").glob("*.json"))
        assert len(locators) == 1 and oct(locators[0].stat().st_mode & 0o777) == "0o600"
        (tmp_path / "go").touch()
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
    assert list((runtime / "taskd").glob("*.json")) == []  # the run removed its own
    gone = _status(env, "--timeout", "1")  # nothing local: the default address, as before
    assert gone.returncode == 1 and "127.0.0.1:8899" in gone.stderr, gone.stderr
