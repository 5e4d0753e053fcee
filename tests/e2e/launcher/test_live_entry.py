"""Live recovery does not depend on how the script is started (issue 32, F3).

A training script reached through a helper entry (`import lm_live; lm_live.main()`, as most repositories do) or
run by a `--no-python` wrapper (`nice -n 1 python -u lm_live.py`, the form docs/pytorch.md gives for NUMA
binding) recovers a killed rank in place, its survivors keeping their processes, as the script itself does.
Before, both got job-rescheduling (every rank restarted) and the console blamed the script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from support.run import run_to_end  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
ARGS = ["--hidden", "32", "--layers", "2", "--steps", "16", "--ckpt-every", "8", "--step-sleep", "0.05",
        "--pg-timeout", "30", "--crash", "1:6"]
TIMEOUT = 150.0


def run(tmp: Path, command: list[str], flags: list[str] = ()) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    argv = [sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nproc-per-node", "2", *flags,
            *command, *ARGS, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out")]
    return run_to_end(argv, tmp / "console.log", TIMEOUT, env=env, cwd=tmp)


def assert_recovered_in_place(tmp: Path, code: int, console: str) -> None:
    assert code == 0, console[-6000:]
    assert "strategy: recover for rank(s) [1]" in console, console[-6000:]
    assert "job-rescheduling" not in console and "not every rank declared" not in console, console[-6000:]
    found = re.search(r"started \d+ rank\(s\) \(rank:pid ([0-9:, ]+)\)", console)
    assert found, console[-3000:]
    started = {int(r): int(p) for r, p in (item.split(":") for item in found.group(1).split(", "))}
    info = json.loads((tmp / "out" / "summary.json").read_text())
    assert info["ranks"]["0"]["pid"] == started[0], console[-6000:]  # the survivor kept its process
    assert info["recomputed"]["0"] == 0


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A repository's layout: the training code in a module of its own, the entry a two-line file."""
    shutil.copy(EXAMPLE, tmp_path / "lm_live.py")
    (tmp_path / "train_entry.py").write_text("import sys\nimport lm_live\n\nsys.exit(lm_live.main())\n")
    return tmp_path


def test_a_helper_module_entry_recovers_in_place(project: Path) -> None:
    code, console = run(project, [str(project / "train_entry.py")])
    assert_recovered_in_place(project, code, console)


def test_a_no_python_wrapper_recovers_in_place(project: Path) -> None:
    code, console = run(project, ["nice", "-n", "1", sys.executable, "-u", "lm_live.py"], ["--no-python"])
    assert_recovered_in_place(project, code, console)


def test_a_script_taskd_run_cannot_read_is_told_by_live_group_why_it_is_not_live(project: Path) -> None:
    """A shell script that runs Python is past what taskd run reads: LiveGroup says so on rank 0, with the fix."""
    wrapper = project / "train.sh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -u lm_live.py "$@"\n')
    wrapper.chmod(0o755)
    argv = ["--hidden", "32", "--layers", "2", "--steps", "4", "--ckpt-every", "8", "--pg-timeout", "30"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    proc = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", "--no-python", str(wrapper),
                           *argv, "--ckpt-dir", str(project / "ckpt"), "--out", str(project / "out")],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=project, env=env)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    assert console.count("live recovery is off for this job: taskd run did not see") == 1, console[-6000:]
    assert "set TASKD_RDZV_STORE=agent" in console
