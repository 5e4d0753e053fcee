"""A hand-damaged state file meets a real `taskd server` (issue 31, F7-F9): a bad job row is left out with a
message naming the file, the job and the field, and the others load; a write-ahead log that would lose commits,
and a file a newer taskd wrote, are refused with what to do, and the files are left as they were."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from support.scripted_agent import ScriptedAgent

from taskd.controller.storage.store import STATE_VERSION

REPO = Path(__file__).resolve().parents[3]


def server(state: Path) -> tuple[subprocess.Popen, str]:
    """`taskd server` on a free loopback port; its address (the process is still running), or raises with its
    output if it exited."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state",
                             str(state), "--log-level", "INFO"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    line = proc.stdout.readline()  # "taskd controller listening on HOST:PORT"; EOF if it exited
    if "listening on" not in line:
        proc.wait(30)
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr.read()}")
    return proc, line.split()[-1]


def stop(proc: subprocess.Popen, how: int = signal.SIGTERM) -> str:
    """Stop it; its log (stderr)."""
    proc.send_signal(how)
    _, err = proc.communicate(timeout=30)
    return err


def refused(state: Path) -> tuple[int, str]:
    """A `taskd server` that must not start: its exit code and stderr."""
    try:
        proc, _ = server(state)
    except AssertionError as exc:
        code, _, text = str(exc).partition(": ")
        return int(code.split()[-1]), text
    stop(proc)
    raise AssertionError("taskd server started on a state file it should have refused")


def jobs_in(state: Path, *names: str) -> None:
    proc, addr = server(state)
    try:
        for name in names:
            agent = ScriptedAgent(addr, name).join()
            agent.close()
    finally:
        stop(proc)


def edit_snapshot(path: Path, job: str, text: str | None = None, **fields: object) -> None:
    with sqlite3.connect(path) as c:
        if text is None:
            snap = json.loads(c.execute("SELECT snapshot FROM jobs WHERE job_id=?", (job,)).fetchone()[0])
            snap.update(fields)
            text = json.dumps(snap)
        c.execute("UPDATE jobs SET snapshot=? WHERE job_id=?", (text, job))
    c.close()


def test_bad_rows_are_named_and_left_out_and_the_other_jobs_load(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    jobs_in(state, "good", "words", "garbled", "paused")
    edit_snapshot(state, "words", restarts="three")
    edit_snapshot(state, "garbled", text='{"job_id": "garbled", state: RUNNING')
    edit_snapshot(state, "paused", state="PAUSED")
    proc, addr = server(state)
    try:
        listed = ScriptedAgent(addr, "x").list_jobs()
        assert listed.status.code == 0, listed.status.info
        assert [j.jobId for j in listed.jobs] == ["good"]
        again = ScriptedAgent(addr, "words")  # its agents' next Init creates it afresh, over the bad row
        assert again.init().code == 0 and again.register().code == 0
        again.close()
        assert [j.restarts for j in ScriptedAgent(addr, "x").list_jobs("words").jobs] == [0]
    finally:
        log = stop(proc)
    assert f"state file {state}: job 'words' not loaded: field restarts is 'three', not a whole number" in log, log
    assert f"state file {state}: job 'garbled' not loaded: its snapshot is not JSON" in log, log
    assert f"state file {state}: job 'paused' not loaded: field state is 'PAUSED', not one of RUNNING" in log, log
    assert "Traceback" not in log, log


def test_a_write_ahead_log_that_would_lose_commits_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    proc, addr = server(state)
    for name in ("a", "b"):
        ScriptedAgent(addr, name).join().close()
    stop(proc, signal.SIGKILL)  # the commits stay in the log, not checkpointed
    wal = Path(f"{state}-wal")
    data = bytearray(wal.read_bytes())
    assert len(data) > 32 + 24 + 4096
    data[32 + 24 + 2000] ^= 0xFF  # a byte of the first frame's page
    wal.write_bytes(bytes(data))
    code, err = refused(state)
    assert code == 1, err
    assert f"write-ahead log {wal}" in err and "frame 1 fails its checksum" in err, err
    assert "would silently drop" in err and f"move {wal} aside" in err, err
    assert wal.read_bytes() == bytes(data)  # the evidence is kept


def test_a_state_file_of_a_newer_taskd_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "ctl.sqlite3"
    jobs_in(state, "j")
    c = sqlite3.connect(state)
    assert c.execute("PRAGMA user_version").fetchone()[0] == STATE_VERSION
    c.execute(f"PRAGMA user_version = {STATE_VERSION + 7}")
    c.close()
    before = state.read_bytes()
    code, err = refused(state)
    assert code == 1, err
    assert f"cannot use {state} as the controller's state: it was written by a newer taskd (state version " \
           f"{STATE_VERSION + 7}; this taskd reads versions up to {STATE_VERSION}" in err, err
    assert state.read_bytes() == before
