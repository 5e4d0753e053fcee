"""bench/goodput_projection.py's arithmetic: goodput, Young's interval, each system's lost seconds from its inputs."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "goodput_projection.py"
_spec = importlib.util.spec_from_file_location("goodput_projection", _PATH)
gp = importlib.util.module_from_spec(_spec)
sys.modules["goodput_projection"] = gp  # dataclasses look their module up there
_spec.loader.exec_module(gp)


def test_goodput_is_the_steady_share_times_the_share_faults_leave() -> None:
    assert gp.goodput(36.0, 0.0, 3600.0) == pytest.approx(0.99)
    assert gp.goodput(36.0, 0.02, 3600.0) == pytest.approx(0.98 * 0.99)
    assert gp.goodput(3600.0, 0.0, 3600.0) == 0.0  # a fault costs the whole MTTF: no progress
    assert gp.goodput(7200.0, 0.0, 3600.0) == 0.0  # never negative


def test_young_interval_balances_stall_against_redone_work() -> None:
    assert gp.young_interval(2.0, 3600.0) == pytest.approx(120.0)
    i = gp.young_interval(4.0, 10_000.0)  # at Young's interval the two costs per fault-free hour are equal
    assert 4.0 / i == pytest.approx((i / 2.0) / 10_000.0)


def test_every_system_is_projected_from_its_named_inputs() -> None:
    v = gp.values({"hang_share": 0.0, "fanout_10k_s": 1.0, "controller_broadcasts": 3})
    rows = {r.system: r for r in gp.project(1024, 7.9 * 3600.0, v)}
    assert set(rows) == {"taskd live", "taskd snapshots", "taskd job-rescheduling (disk)",
                         "torchrun + disk checkpoints", "torchft (live)"}
    rounds = 3 * 1.0 * (1024 / 8) / 10_000  # three broadcasts to 128 agents at 1 s per 10,000
    live = rows["taskd live"]
    assert live.detect_s == pytest.approx(v["kill_detect_s"])
    assert live.pause_s == pytest.approx(rounds + v["regroup_1024_s"] + v["state_gb_1024"] / v["net_gbps"])
    assert live.redone_s == v["step_s"] and live.overhead == v["live_overhead"]
    stall = v["state_gb_1024"] * 8 / v["disk_write_gbps"]
    disk = rows["taskd job-rescheduling (disk)"]
    assert disk.interval_s == pytest.approx(math.sqrt(2 * stall * 7.9 * 3600.0))
    assert disk.redone_s == pytest.approx(disk.interval_s / 2)
    assert disk.overhead == pytest.approx(stall / disk.interval_s)
    assert disk.pause_s == pytest.approx(rounds + v["restart_1024_s"] + v["state_gb_1024"] * 8 / v["disk_read_gbps"])
    assert rows["torchrun + disk checkpoints"].pause_s == pytest.approx(disk.pause_s - rounds)
    assert live.goodput == pytest.approx((1 - live.overhead) * (1 - live.lost_s / (7.9 * 3600.0)))


def test_a_hang_costs_each_system_the_time_it_takes_to_be_found() -> None:
    v = gp.values({"hang_share": 1.0})
    rows = {r.system: r for r in gp.project(16384, 1.8 * 3600.0, v)}
    assert rows["taskd live"].detect_s == v["heartbeat_timeout_s"]
    assert rows["torchrun + disk checkpoints"].detect_s == v["collective_timeout_s"]


def test_an_unknown_input_is_refused_and_changes_nothing() -> None:
    before = gp.values()
    with pytest.raises(ValueError, match="no input named 'step_seconds'"):
        gp.values({"step_seconds": 1.0})
    assert gp.values() == before
