"""bench/live_overhead.py --quick: the paired method's jobs run (2 ranks, a 0.7 M model, 4 pairs of 2-step blocks under
taskd run and under torchrun), print the parts of the cost with their intervals and write them to the JSON. No
timing is asserted: the figures live in BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.mark.timeout(120)
def test_quick_run_prints_the_parts_and_writes_them(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "live_overhead.py"), "--quick"], capture_output=True,
                          text=True, cwd=BENCH.parent, env=env, timeout=110)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for text in ("per-step work", "launcher: taskd's agent", "taskd's threads in the ranks", "**total**",
                 "null check", "CPU cost vs plain %", " ± "):
        assert text in proc.stdout, proc.stdout
    data = json.loads((tmp_path / "live_overhead.json").read_text())
    assert data["method"] == "paired" and data["quick"] is True
    (row,) = data["summary"].values()
    assert row["pairs"] == 4 and row["null_pairs"] == 4
    for part in ("per_step", "launcher", "threads", "total", "null", "wall"):
        assert row[part]["mean"] is not None, part
    assert row["per_step"]["n"] == 4 and row["per_step"]["half"] is not None
    assert "taskd-leave-watch" in row["thread_names"]
