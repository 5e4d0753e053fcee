"""A live msrun whose taskd agent hides its environment (process/conceal.py) does not make its workers stale.

`stale_msrun_workers` calls a worker stale when its parent's environment is not an msrun of the job; an
agent made non-dumpable refuses its environment to the rest of its user (issue 31, F4), so its live
workers must not be taken for a dead msrun's and killed by the next msrun on the host. Run without
capabilities (setpriv, when the suite is root): with CAP_SYS_PTRACE every environment is readable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, STARTED, wait_for

PARENT = """\
import os, subprocess, sys, time
from taskd.process.conceal import conceal
conceal((), (), lambda name: False)
env = dict(os.environ, MINDX_TASK_ID="job-c", MS_ROLE="MS_WORKER", RANK_ID="0")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""
CHECK = """\
import json, sys
from taskd.process.msrun import stale_msrun_workers
print(json.dumps([p.pid for p in stale_msrun_workers("job-c", [0])]))
"""


def test_the_workers_of_a_live_concealed_msrun_are_not_stale(tmp_path: Path) -> None:
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root, and no setpriv to drop CAP_SYS_PTRACE with")
        prefix = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pid_file = tmp_path / "worker.pid"
    # "msrun" in its command line, as a real msrun has: a concealed process not named so is not taken for one
    parent = subprocess.Popen([*prefix, sys.executable, "-c", PARENT, str(pid_file), "msrun"], env=env, cwd=ROOT)
    STARTED.append(parent)
    try:
        worker = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the worker to start"))
        out = subprocess.run([*prefix, sys.executable, "-c", CHECK], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert worker not in json.loads(out.stdout), "a live msrun's worker was called stale"
    finally:
        parent.kill()
        parent.wait(timeout=30)
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
