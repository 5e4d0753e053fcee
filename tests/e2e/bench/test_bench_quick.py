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
    "controller_core": ("| N jobs", {"runs", "machine"}),
    "hand_over": ("| hand_over", {"hand_over", "two_tensors", "state_equal", "machine"}),
    "overhead": ("| taskd run", {"taskd", "torchrun", "worker_sdk_us_per_call", "taskd_over_torchrun"}),
    "snapshots": ("| dcp.async_save k=1", {"runs", "restores", "summary", "state_bytes", "dlrover"}),
    "ddp_exit_abort": ("| plain", {"runs", "endings", "machine"}),
}
NEEDS_TORCH = {"snapshots", "ddp_exit_abort"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run_prints_table_and_writes_json(name: str, tmp_path: Path) -> None:
    if name in NEEDS_TORCH:
        pytest.importorskip("torch")
    result = tmp_path / f"{name}.json"
    # DLRover's rows need a venv of their own (bench/dlrover_peer.py): not here, so the run says it skipped them
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "TASKD_BENCH_DLROVER_PYTHON": str(tmp_path / "absent")}
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line, keys = EXPECTED[name]
    assert line in proc.stdout, proc.stdout
    data = json.loads(result.read_text())
    assert keys <= set(data), f"missing keys {keys - set(data)}"
    assert data["quick"] is True
    assert data["benchmark"] == name
    if name == "snapshots":  # its steady-state costs: paired per round, printed as 95 % intervals
        assert "CPU cost vs none" in proc.stdout and " ± " in proc.stdout, proc.stdout
        for label, row in data["summary"].items():
            if not label.startswith("restore") and label != "none":
                assert row["rounds"] == 2 and row["cpu_cost_pct_interval"]["n"] == 2, row
                pairs = zip(data["runs"][label], data["runs"]["none"], strict=True)
                assert_interval(row["cpu_cost_pct_interval"],
                                [100.0 * (r["cpu_per_step"] / b["cpu_per_step"] - 1.0) for r, b in pairs])
        for row in ("| taskd k=5", "| torch.save k=5", "| dcp.async_save k=5", "| taskd: local memory",
                    "| taskd: buddy's copy (fetch + restore)", "| torch.load: disk (cache dropped)",
                    "| dcp.load: disk (cache dropped)"):  # every method's rows, and each restore source
            assert row in proc.stdout, proc.stdout
        assert "skipped: DLRover Flash Checkpoint: no DLRover venv at" in proc.stdout, proc.stdout


T975_1 = 12.706  # Student's t, 97.5th percentile, 1 degree of freedom: the interval of 2 repetitions


def assert_interval(interval: dict, values: list[float]) -> None:
    """`interval` is the mean of 2 values and the half-width of its 95 % interval."""
    assert len(values) == 2 and interval["n"] == 2, (interval, values)
    mean = sum(values) / 2
    sd = ((values[0] - mean) ** 2 + (values[1] - mean) ** 2) ** 0.5  # n - 1 = 1
    assert interval["mean"] == pytest.approx(mean) and interval["half"] == pytest.approx(T975_1 * sd / 2 ** 0.5)


@pytest.mark.timeout(80)
def test_controller_scale_limit_quick_prints_taskd_over_the_null_server(tmp_path: Path) -> None:
    """controller_scale.py --scenario limit --quick: 20 one-agent jobs fault at once on taskd's server, then on
    bench/null_controller.py (the same wire with no controller behind it); on each every job is sent its
    changeStrategy (recover) and its recover status is answered 0 (the round closed); the bench prints taskd's p99
    over the null server's, computed from the two runs it records."""
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "controller_scale.py"), "--scenario", "limit", "--quick",
                           "--fanout-procs", "0"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=70)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "fault->changeStrategy p50 s" in proc.stdout, proc.stdout
    [run] = json.loads((tmp_path / "controller_scale.json").read_text())["runs"]
    [pair] = run["pairs"]
    for server in ("taskd", "null"):
        r = pair[server]
        assert "error" not in r, r
        assert r["fault_codes"] == {"0": 20} and r["changed"] == 20
        assert r["strategies"] == {"recover": 20} and r["status_codes"] == {"0": 20}
        assert 0 < r["fault_to_change_ms"]["p50"] <= r["fault_to_change_ms"]["p99"] <= r["fault_to_change_ms"]["max"]
        assert r["controller_cpu_s"] >= 0 and r["clients_cpu_s"] >= 0  # CPU seconds, 10 ms ticks: may be 0
    assert pair["null"].get("server") == "null" and "server" not in pair["taskd"]
    ratio = pair["taskd"]["fault_to_change_ms"]["p99"] / pair["null"]["fault_to_change_ms"]["p99"]
    assert pair["ratio_p99"] == pytest.approx(ratio) and run["ratio_p99"]["median"] == pytest.approx(ratio)
    assert f"median {ratio:.2f}x over 1 pair(s)" in proc.stdout, proc.stdout
    if pair["null"]["controller_cpu_s"]:  # 10 ms ticks: 20 jobs' round may read 0 CPU seconds
        cpu = pair["taskd"]["controller_cpu_s"] / pair["null"]["controller_cpu_s"]
        assert run["ratio_server_cpu"]["values"] == [pytest.approx(cpu)]
    assert "fanout" not in run


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


PEERS_COLUMNS = ("| system", "resumed", "kill → resumed p50 s", "min s", "max s",
                 "steps redone: survivors / killed rank", "survivors kept their process", "bit-identical",
                 "leftovers (jobs checked)", "p50 / taskd's best (script-mode spare if run)")
QUICK_SYSTEMS = ("taskd live + warm spare", "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")


@pytest.mark.timeout(200)
def test_peers_quick_recovers_live_and_under_torchrun(tmp_path: Path) -> None:
    """bench/peers.py --quick: 2 ranks of a small DDP model (train_ddp.py), the same seeded SIGKILL under taskd live
    with a warm spare (its checkpoints saved in the background, --ckpt-async) and under torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (blocking saves). Both resume and end bit-identical
    to their fault-free run with nothing left running; taskd's survivors keep their processes and no rank redoes a
    step. The peers not run (torchft, NVRx: not installed, or not part of --quick) are named with the reason."""
    pytest.importorskip("torch")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "peers.py"), "--quick", "--ckpt-async"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=180)  # taskd's job saves in the background
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    header = next((line for line in proc.stdout.splitlines() if line.startswith("| system")), "")
    for column in PEERS_COLUMNS:
        assert column in header, f"column {column!r} missing from {header!r}"
    for label in ("torchft, Manager.allreduce", "torchft + its DDP wrapper", "NVRx ft_launcher"):
        assert f"skipped: {label}: " in proc.stdout, proc.stdout
    data = json.loads((tmp_path / "peers.json").read_text())
    assert data["quick"] is True and data["benchmark"] == "peers" and data["systems"] == list(QUICK_SYSTEMS)
    assert data["ckpt_async"] is True
    assert all(r["ok"] for r in data["references"].values()), data["references"]
    rows = {r["system"]: r for r in data["rows"]}
    for label in QUICK_SYSTEMS:
        row = rows[label]
        assert f"| {label}" in proc.stdout
        assert (row["resumed"], row["runs"], row["bit_identical"], row["leftovers"], row["leftovers_checked"]) == \
            (1, 1, 1, 0, 1), row
        assert 0 < row["min_s"] <= row["p50_s"] <= row["max_s"], row
    for run in data["runs"]:  # live_recovery's cost beyond the redone step: kill → resumed minus one fault-free step
        assert run["step_s"] > 0 and run["beyond_step_s"] == pytest.approx(run["resumed_s"] - run["step_s"]), run
    live = rows["taskd live + warm spare"]
    assert (live["redone_survivors_max"], live["redone_killed_max"], live["survivors_kept_processes"]) == (0, 0, 1)
    assert live["over_taskd_best"] == pytest.approx(1.0)
    [kill] = {json.dumps(r["kill"]) for r in data["runs"]}  # the same seeded kill for both systems
    assert json.loads(kill)["victim"] in (0, 1)


GOODPUT_COLUMNS = ("| system", "fault-free s", "with faults s", "faults (kills/hangs)", "goodput",
                   "goodput vs fastest fault-free", "lost s per fault", "fault → resumed p50 s",
                   "steps redone (all ranks)", "bit-identical", "leftovers", "lost / best peer's")
GOODPUT_QUICK = ("taskd live + script-mode spare", "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")


@pytest.mark.timeout(300)
def test_goodput_quick_same_fault_under_taskd_live_and_torchrun(tmp_path: Path) -> None:
    """bench/goodput.py --quick: 2 ranks of a small train_ddp.py job, each system run fault-free and then under the
    same seeded schedule (one SIGKILL): both finish bit-identical to their fault-free run with nothing left running,
    the fault is timed to every rank past its next step, taskd live redoes no step, and the goodput, the lost time
    and the ratio to the best peer (torchrun here) are the ones the two runs' times give."""
    pytest.importorskip("torch")
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(BENCH / "goodput.py"), "--quick"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=280)  # ~40 s alone on 2 cores; 160 s seen at load 11
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    header = next((line for line in proc.stdout.splitlines() if line.startswith("| system")), "")
    for column in GOODPUT_COLUMNS:
        assert column in header, f"column {column!r} missing from {header!r}"
    data = json.loads((tmp_path / "goodput.json").read_text())
    assert data["quick"] is True and data["benchmark"] == "goodput" and data["systems"] == list(GOODPUT_QUICK)
    [fault] = data["schedule"]
    assert fault["kind"] == "kill" and fault["rank"] in (0, 1)
    rows = {r["system"]: r for r in data["rows"]}
    for label in GOODPUT_QUICK:
        row = rows[label]
        assert row["ok"] and (row["faults"], row["kills"], row["unresumed"]) == (1, 1, 0), row
        assert row["bit_identical"] is True and row["leftovers"] == [], row
        assert row["goodput"] == pytest.approx(row["fault_free_s"] / row["with_faults_s"])
        assert row["lost_s"] == pytest.approx(row["with_faults_s"] - row["fault_free_s"])
        assert 0 < row["fault_to_resumed_s"]["p50"] < 30, row
    faulted = [r for r in data["runs"] if r["faulted"]]
    assert [(f["kind"], f["rank"], f["at"]) for r in faulted for f in r["faults"]] == \
        [(fault["kind"], fault["rank"], fault["at"])] * 2  # the same fault for both systems
    live_fault, torchrun_fault = (f for r in faulted for f in r["faults"])
    assert 0 <= live_fault["detected_s"] < live_fault["resumed_s"]  # the agent's fault record, timed
    assert "detected_s" not in torchrun_fault  # torchrun logs none: its breakdown says so
    assert rows[GOODPUT_QUICK[0]]["redone_steps"] == 0 and rows[GOODPUT_QUICK[1]]["redone_steps"] > 0
    assert data["best_peer"] == GOODPUT_QUICK[1] and rows[GOODPUT_QUICK[1]]["lost_over_best_peer"] == 1.0
    assert rows[GOODPUT_QUICK[0]]["lost_over_best_peer"] == pytest.approx(
        rows[GOODPUT_QUICK[0]]["lost_s"] / rows[GOODPUT_QUICK[1]]["lost_s"])
    assert "skipped: taskd + in-memory snapshots: not run by --quick" in proc.stdout
    assert data["settings"]["baseline_runs"] == 1 and proc.stdout.startswith("estimate (a model")
    # one fault-free run per system measures no spread: every goal line declines its verdict
    assert data["goals"] == {"goodput": "cannot tell", "peer": "cannot tell", "qualifies": "cannot tell"}
    assert "goal, taskd's best (taskd live + script-mode spare) keeps goodput >= 97%" in proc.stdout
