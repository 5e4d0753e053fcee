"""Each benchmark script still runs: `python bench/NAME.py --quick` prints its table and writes valid JSON.

The figures themselves are not asserted (they depend on the machine); BENCHMARKS.md records them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"

# script name -> (a line its table prints, keys its JSON must hold)
EXPECTED = {
    "detection": ("| taskd agent notices", {"taskd", "torchrun", "kills", "machine"}),
    "recovery": ("| taskd recover", {"taskd", "torchrun", "sizes", "ratios_torchrun_over_taskd_first_line_p50"}),
    "work_lost": ("| recover", {"runs", "summary", "ks"}),
    "controller_scale": ("| N ", {"runs", "sizes", "largest_n_with_fanout_p99_under_1s"}),
    "overhead": ("| taskd run", {"taskd", "torchrun", "worker_sdk_us_per_call", "taskd_over_torchrun"}),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_prints_table_and_writes_json(name: str, tmp_path: Path) -> None:
    result = tmp_path / f"{name}.json"
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line, keys = EXPECTED[name]
    assert line in proc.stdout, proc.stdout
    data = json.loads(result.read_text())
    assert keys <= set(data), f"missing keys {keys - set(data)}"
    assert data["quick"] is True
    assert data["benchmark"] == name


@pytest.mark.timeout(60)
def test_controller_scale_many_jobs_fault_quick(tmp_path: Path) -> None:
    """controller_scale.py --scenario many-jobs-fault --quick: 20 one-agent jobs fault at once on a real server;
    every job is sent its changeStrategy (recover) and its recover status is answered 0 (the round closed)."""
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "controller_scale.py"), "--scenario", "many-jobs-fault",
                           "--quick"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=50)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "fault->changeStrategy p50 ms" in proc.stdout, proc.stdout
    [run] = json.loads((tmp_path / "controller_scale.json").read_text())["runs"]
    assert "error" not in run, run
    assert run["fault_codes"] == {"0": 20} and run["changed"] == 20
    assert run["strategies"] == {"recover": 20} and run["status_codes"] == {"0": 20}
    assert 0 < run["fault_to_change_ms"]["p50"] <= run["fault_to_change_ms"]["p99"] <= run["fault_to_change_ms"]["max"]


@pytest.mark.timeout(200)
@pytest.mark.mindspore
def test_msrun_recovery_quick_names_every_phase(tmp_path: Path) -> None:
    """bench/msrun_recovery.py --quick: real msrun, 2 ranks of train_dp.py, one kill; every phase is measured."""
    pytest.importorskip("mindspore")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, str(BENCH / "msrun_recovery.py"), "--quick"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    [run] = json.loads((tmp_path / "msrun_recovery_2.json").read_text())["runs"]
    assert run["exit_code"] == 0 and run["strategy"] == "job-rescheduling" and run["left_behind"] == []
    missing = [name for name, value in run["phases"].items() if value is None]
    assert not missing, f"phases not measured: {missing}\n{proc.stdout[-3000:]}"
    assert run["total"] == pytest.approx(sum(run["phases"].values()), abs=1e-6)
    assert "| communication init" in proc.stdout and "kill -> every rank past a new step" in proc.stdout


LIVE_COLUMNS = ("| configuration", "kill → resumed p50 s", "kill → resumed p99 s", "recomputed survivors mean / max",
                "recomputed killed rank mean / max", "bit-identical", "strategies used", "torchrun / this (p50)")


@pytest.mark.timeout(660)
def test_live_recovery_quick_prints_every_configuration(tmp_path: Path) -> None:
    """bench/live_recovery.py --quick: 2 ranks of a small DDP model, one kill under each of the four launchers."""
    pytest.importorskip("torch")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "live_recovery.py"), "--quick"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    header = next((line for line in proc.stdout.splitlines() if line.startswith("| configuration")), "")
    for column in LIVE_COLUMNS:
        assert column in header, f"column {column!r} missing from {header!r}"
    for label in ("taskd recover + warm spare", "taskd recover ", "taskd job-rescheduling", "torchrun --max-restarts"):
        assert f"| {label}" in proc.stdout, proc.stdout
    data = json.loads((tmp_path / "live_recovery.json").read_text())
    assert {"runs", "summary", "references", "sizes", "ratios_torchrun_over_live_p50"} <= set(data)
    assert data["quick"] is True and data["benchmark"] == "live_recovery"
    assert len(data["runs"]) == 4 and all(r["kill"] is not None for r in data["runs"])
