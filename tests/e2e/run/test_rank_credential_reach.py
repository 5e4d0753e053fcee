"""No credential a rank can reach (issue 31, F4): a real rank of a real `taskd run` goes after its agent's.

The rank (rank_probe.py) reads its parent's /proc/<pid>/environ, cmdline, maps and mem, the files they
name, and every `taskd status` locator of its user, then makes a control call with whatever it found.
Ranks run as the agent's user; as root the suite would hold CAP_SYS_PTRACE, which reads any process,
so the `taskd run` here runs without capabilities (setpriv): as any other user's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, STARTED, secret_file, wait_for
from support.restartable import server

PROBE = Path(__file__).with_name("rank_probe.py")
ADMIN = "probe-admin-0123456789abcdef0123456789"
WAIT_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
REFUSED = {"UNAUTHENTICATED", "PERMISSION_DENIED"}


def as_a_user() -> list[str]:
    """A prefix that runs a command without capabilities (what root has and a user has not)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and no setpriv to drop CAP_SYS_PTRACE with")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The runs' environment: XDG_RUNTIME_DIR and HOME of their own, so that the probe finds no locator but
    this test's (never another test's or a user's run on this host)."""
    runtime, home = tmp_path / "runtime", tmp_path / "home"
    for folder in (runtime, home):
        folder.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_TOKEN", "TASKD_TLS", "MINDX_"))}
    env.update({"XDG_RUNTIME_DIR": str(runtime), "HOME": str(home), "PYTHONPATH": str(ROOT), **extra})
    return env


def taskd_run(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*as_a_user(), sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(proc)
    return proc


def status(env: dict[str, str]) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--json"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["jobs"]


def assert_found_nothing(result: dict, agent_pid: int, secret_paths: list[str]) -> None:
    assert result["ppid"] == agent_pid  # the probe's parent is the agent itself
    assert not result["environ_readable"], "the rank read /proc/<agent>/environ"
    assert not result["mem_readable"], "the rank read /proc/<agent>/mem"
    assert "taskd.run" in result["cmdline"]  # the command line stays readable ...
    for path in secret_paths:  # ... and names no credential
        assert path not in result["cmdline"], result["cmdline"]
    assert result["paths"] == [] and result["tokens"] == [], result


def test_a_rank_under_a_server_finds_no_credential_and_controls_nothing(tmp_path: Path) -> None:
    """The worst case the probe found: the agent holds the admin token, given by --token-file and
    TASKD_TOKEN_FILE both. Its rank finds neither the path nor the token, and is refused."""
    token_file = secret_file(tmp_path / "admin.token", ADMIN + "\n")
    with server(tmp_path, ("--token-file", str(token_file))) as srv:
        port = srv.port
        result_file = tmp_path / "probe.json"
        run = taskd_run(["--server", f"127.0.0.1:{port}", "--token-file", str(token_file), "--job-id", "probed",
                         "--nproc-per-node", "1", str(PROBE), str(result_file), f"127.0.0.1:{port}"],
                        tmp_path / "run.log", env_for(tmp_path, TASKD_TOKEN_FILE=str(token_file)))
        assert run.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()
        result = json.loads(result_file.read_text())
        assert_found_nothing(result, run.pid, [str(token_file)])
        assert result["locators"] == []
        tried = [(a["call"], a["via"], a["outcome"]) for a in result["attempts"]]
        assert tried == [("ListJobs", "nothing", "UNAUTHENTICATED"),
                         ("ReportProcessFault", "nothing", "UNAUTHENTICATED")], tried
        assert "job succeeded" in (tmp_path / "run.log").read_text()


def test_a_standalone_rank_reads_the_locators_and_controls_no_job(tmp_path: Path) -> None:
    """Two standalone `taskd run`s of one user: a rank of the second reads both locators (its own run's and
    the first's), may list their jobs as `taskd status` does, and every fault report it sends is refused;
    the first job is untouched (no round, no restart) and both succeed."""
    env = env_for(tmp_path)
    runtime = tmp_path / "runtime"
    waiter = tmp_path / "wait.py"
    waiter.write_text(WAIT_FILE)
    victim = taskd_run(["--job-id", "victim", "--nproc-per-node", "1", str(waiter), str(tmp_path / "go")],
                       tmp_path / "victim.log", env)
    try:
        wait_for(lambda: list((runtime / "taskd").glob("*.json")) if (runtime / "taskd").is_dir() else [], 60,
                 "the first run's locator")
        wait_for(lambda: "started 1 rank(s)" in (tmp_path / "victim.log").read_text(), 60, "its rank to start")
        result_file = tmp_path / "probe.json"
        prober = taskd_run(["--job-id", "prober", "--nproc-per-node", "1", str(PROBE), str(result_file)],
                           tmp_path / "prober.log", env)
        assert prober.wait(timeout=120) == 0, (tmp_path / "prober.log").read_text()
        result = json.loads(result_file.read_text())
        assert_found_nothing(result, prober.pid, [])
        assert len(result["locators"]) == 2, result["locators"]
        assert {loc["token"] for loc in result["locators"]} == {"tds1."}  # status credentials only
        reports = [a for a in result["attempts"] if a["call"] == "ReportProcessFault"]
        assert {a["job"] for a in reports} == {"victim", "prober"}, reports
        assert all(a["outcome"] in REFUSED for a in reports), reports
        listed = [a for a in result["attempts"] if a["call"] == "ListJobs"]
        assert {a["outcome"] for a in listed if a["via"] == "tds1."} == {"ok"}, listed
        assert {a["outcome"] for a in listed if a["via"] == "nothing"} == {"UNAUTHENTICATED"}, listed
        jobs = {j["jobId"]: j for j in status(env)}
        assert jobs["victim"]["state"] == "RUNNING" and not jobs["victim"].get("restarts"), jobs["victim"]
        assert not jobs["victim"].get("rounds"), jobs["victim"]
        (tmp_path / "go").touch()
        assert victim.wait(timeout=60) == 0, (tmp_path / "victim.log").read_text()
    finally:
        if victim.poll() is None:
            victim.kill()
