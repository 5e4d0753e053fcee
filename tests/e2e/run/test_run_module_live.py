"""`taskd run -m MODULE` keeps live recovery (issue 21, D4): the module's source is read like a script's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.run import ROOT

pytest.importorskip("torch")

PROBE = """
import os, sys
import taskd.worker.torch  # the live binding: the agent hosts the store that outlives every rank
open(sys.argv[1] + os.environ["RANK"], "w").write(os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "unset"))
"""


@pytest.mark.torch
def test_a_module_that_imports_the_live_binding_gets_the_agent_store_as_a_script_does(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "lm_live.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID", "TASKD_RDZV_STORE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "store-"
    proc = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", "-m", "mypkg.lm_live",
                           str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(tmp_path / f"store-{r}").read_text() for r in range(2)] == ["True", "True"], proc.stderr
