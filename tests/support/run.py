"""`taskd run` as the e2e tests start it (shared by tests/e2e/run, agent and others)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import ROOT, STARTED

EXAMPLE = ROOT / "examples" / "train_resumable.py"


def taskd_run(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`taskd run ARGS` from the repository, its console into `log`, with no controller address from outside;
    killed after the test if it is still running (tests/conftest.py)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MINDX_SERVER_IP", None)
    full_env.pop("MINDX_TASK_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", *args],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    STARTED.append(proc)
    return proc
