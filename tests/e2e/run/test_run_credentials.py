"""`taskd run --server` against a controller that requires a token: --token-file (or TASKD_TOKEN_FILE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import STARTED, secret_file, wait_for
from support.restartable import server

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "a-token-for-tests-0123456789abcdef"


@pytest.fixture()
def guarded_server(tmp_path: Path):  # noqa: ANN201 (a generator fixture)
    token_file = secret_file(tmp_path / "token", TOKEN + "\n")
    with server(tmp_path, ("--token-file", str(token_file))) as srv:
        yield srv.port, token_file


def run(tmp_path: Path, port: int, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text("import os; print('rank', os.environ['RANK'], 'ok')\n")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_TOKEN", "MINDX_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "taskd.run", "--server", f"127.0.0.1:{port}", *flags,
                           "--nproc-per-node", "2", str(script)], capture_output=True, text=True, timeout=120,
                          env=full_env, cwd=ROOT)


def test_token_file_flag_and_variable_reach_a_guarded_controller(tmp_path: Path, guarded_server) -> None:
    port, token_file = guarded_server
    by_flag = run(tmp_path, port, "--token-file", str(token_file))
    assert by_flag.returncode == 0, by_flag.stderr
    assert "job succeeded" in by_flag.stderr
    by_variable = run(tmp_path, port, env={"TASKD_TOKEN_FILE": str(token_file)})
    assert by_variable.returncode == 0, by_variable.stderr


def test_without_the_token_the_run_stops_before_any_rank_and_says_what_to_set(tmp_path: Path,
                                                                              guarded_server) -> None:
    port, _ = guarded_server
    out = run(tmp_path, port)
    assert out.returncode == 2, out.stderr
    assert "TASKD_TOKEN_FILE" in out.stderr and "rank 0 ok" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_token_file_is_a_usage_error_naming_the_flag(tmp_path: Path, guarded_server) -> None:
    port, _ = guarded_server
    out = run(tmp_path, port, "--token-file", str(tmp_path / "nope"))
    assert out.returncode == 2, out.stderr
    assert "--token-file" in out.stderr and "nope" in out.stderr and "Traceback" not in out.stderr


RANK_WAITS = """\
import os, sys, time
from pathlib import Path
Path(sys.argv[1], f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))
deadline = time.monotonic() + 60
while not Path(sys.argv[1], "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_ranks_see_no_credential_in_their_environment_or_open_files(tmp_path: Path, guarded_server) -> None:
    """A real `taskd run --server --token-file` job with TASKD_TOKEN_FILE and TASKD_TLS_* set as well: each
    rank's /proc/<pid>/environ names no credential variable, holds neither the token nor its path, and
    none of its open files (/proc/<pid>/fd) is the token file. The job still authenticates and succeeds."""
    port, token_file = guarded_server
    script = tmp_path / "wait.py"
    script.write_text(RANK_WAITS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_TOKEN", "TASKD_TLS", "MINDX_"))}
    # TASKD_TLS_* would switch the client to TLS, which this plaintext server does not speak (the unit test
    # tests/unit/launcher/test_rank_env_credentials.py covers them); TASKD_TOKEN_EXTRA holds the token itself
    env.update({"TASKD_TOKEN_FILE": str(token_file), "TASKD_TOKEN_EXTRA": TOKEN})
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--server", f"127.0.0.1:{port}", "--token-file",
                             str(token_file), "--nproc-per-node", "2", str(script), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    STARTED.append(proc)
    try:
        wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 60, "both ranks to start")
        pids = [int((tmp_path / f"ready-{r}").read_text()) for r in (0, 1)]
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            names = [item.split(b"=", 1)[0].decode() for item in environ.split(b"\0") if item]
            assert "RANK" in names  # it is the rank's environment
            assert not [n for n in names if n.startswith(("TASKD_TOKEN", "TASKD_TLS_"))], names
            assert TOKEN.encode() not in environ and str(token_file).encode() not in environ
            opened = []
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    opened.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    continue
            assert str(token_file) not in opened and not any("token" in o for o in opened), opened
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "job succeeded" in err


def test_a_job_credential_file_runs_its_job_and_not_another(tmp_path: Path, guarded_server) -> None:
    from taskd.controller.service.auth import job_credential

    port, _ = guarded_server
    own, other = tmp_path / "own.cred", tmp_path / "other.cred"
    own.write_text(job_credential(TOKEN, "cred-job") + "\n")
    other.write_text(job_credential(TOKEN, "someone-else") + "\n")
    ok = run(tmp_path, port, "--job-id", "cred-job", "--token-file", str(own))
    assert ok.returncode == 0, ok.stderr
    assert "job succeeded" in ok.stderr and "shared admin token" not in ok.stderr
    refused = run(tmp_path, port, "--job-id", "cred-job", "--token-file", str(other))
    assert refused.returncode == 2, refused.stderr
    assert "credential is for job 'someone-else'" in refused.stderr and "rank 0 ok" not in refused.stdout
    admin = run(tmp_path, port, "--job-id", "admin-job", "--token-file", str(guarded_server[1]))
    assert admin.returncode == 0 and "shared admin token" in admin.stderr  # still works, with the warning
