"""A `taskd server` that is SIGKILLed and started again on the same port and state file, and `taskd run` nodes
against it (tests/e2e/agent/test_controller_restart_*.py: issue 31, F2)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from support import ROOT, STARTED, free_port, port_open, wait_for


class Server:
    """A `taskd server` that can be SIGKILLed and started again on the same port and state file."""

    def __init__(self, tmp: Path, flags: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.flags = list(flags)  # more `taskd server` flags, the same at every start
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.state = tmp / "ctl.sqlite3"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.tmp / f"server{self.starts}.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "taskd", "server", "--listen", self.address,
                                      "--state", str(self.state), *self.flags],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        STARTED.append(self.proc)
        wait_for(lambda: port_open(self.port) or self.proc.poll() is not None, 30, "taskd server to listen")
        assert self.proc.poll() is None, self.logs()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def stored_state(self, job: str) -> str:
        """The job's state (and its round's strategy) as the server stored them in its state file."""
        try:
            with contextlib.closing(sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=1)) as db:
                row = db.execute("SELECT snapshot FROM jobs WHERE job_id = ?", (job,)).fetchone()
        except sqlite3.Error:
            return "unreadable"
        if row is None:
            return "absent"
        snap = json.loads(row[0])
        r = snap.get("round") or {}
        return f"{snap['state']} {r.get('strategy', '')}".strip()

    def logs(self) -> str:
        return "\n".join(f"--- server{n}\n{(self.tmp / f'server{n}.log').read_text()}"
                         for n in range(1, self.starts + 1))


@contextlib.contextmanager
def server(tmp: Path, flags: tuple[str, ...] = ()) -> Iterator[Server]:
    s = Server(tmp, flags)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def node(tmp: Path, address: str, job: str, rank: int, extra: list[str], name: str = "") -> subprocess.Popen[bytes]:
    """Node `rank` of a 2-node job (one rank each) in a session of its own; its console in `tmp`/`name`.log
    (default node<rank>)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    args = ["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1", "--job-id", job,
            "--server", address, "--monitor-interval", "0.2", "--stop-grace", "2", *extra]
    log = (tmp / f"{name or f'node{rank}'}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    STARTED.append(proc)
    return proc


def status(address: str, job: str) -> dict:
    """The job's record as `taskd status --json` shows it ({} if the server has none)."""
    out = subprocess.run([sys.executable, "-m", "taskd", "status", "--server", address, "--job", job, "--json"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    jobs = json.loads(out.stdout).get("jobs", []) if out.returncode == 0 else []
    return jobs[0] if jobs else {}


__all__ = ["Server", "node", "server", "status"]
