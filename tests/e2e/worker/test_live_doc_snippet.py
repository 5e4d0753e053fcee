"""docs/pytorch.md's live-recovery snippet is a complete script (issue 21: its names were undefined)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.torch
def test_the_documented_live_script_runs_as_written_under_taskd_run(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "pytorch.md").read_text()
    found = re.search(r"```python\n(# live_min\.py.*?)```", text, re.S)
    assert found, "docs/pytorch.md lost its live_min.py snippet"
    script = tmp_path / "live_min.py"
    script.write_text(found.group(1))
    env = {k: v for k, v in os.environ.items() if k not in ("MINDX_SERVER_IP", "MINDX_TASK_ID")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "taskd.run", "--nproc-per-node", "2", str(script), "20",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job succeeded: 2 ranks" in proc.stderr + proc.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "rank0-step10.pt", "rank0-step20.pt", "rank1-step10.pt", "rank1-step20.pt"]
