"""bench/live_overhead.py's paired method: the arithmetic of pairs and parts, on synthetic blocks (its --quick run is
tests/e2e/bench/test_live_overhead_quick.py). No timing is asserted: the figures live in BENCHMARKS.md."""

from __future__ import annotations

from typing import Any

import pytest
from support.bench import load_bench

lp = load_bench("live_overhead_paired")


def _records(kinds: list[str], cpu: dict[str, float], launcher: float, ranks: int = 2) -> list[dict[str, Any]]:
    """Ranks' records as bench/live_overhead_rank.py's paired mode writes them, every rank alike."""
    return [{"rank": r, "block": 10, "params": 1000, "threads": ["taskd-leave-watch"], "threads_cpu": 0.02,
             "launcher_processes": ["python"],
             "blocks": [{"kind": k, "cpu": cpu[k], "main": cpu[k], "wall": cpu[k] * 2,
                         "launcher": launcher if r == 0 else 0.0, "threads": 0.002} for k in kinds]}
            for r in range(ranks)]


def test_pairs_take_on_against_off_in_either_order() -> None:
    kinds = ["on", "off", "off", "on"]
    bl = lp.blocks(_records(kinds, {"on": 1.1, "off": 1.0}, launcher=0.1))
    assert [b["cpu"] for b in bl] == pytest.approx([2.3, 2.1, 2.1, 2.3])  # every rank's + rank 0's launcher reading
    costs = lp.pair_costs(bl)
    assert costs["cpu_cost"] == pytest.approx([100 * (2.3 / 2.1 - 1)] * 2)
    assert costs["wall_cost"] == pytest.approx([10.0, 10.0])


def test_summary_adds_the_parts_a_job_cannot_switch() -> None:
    live, null = lp.Pooled(), lp.Pooled()
    kinds = ["on", "off", "off", "on", "on", "off"]
    live.add(_records(kinds, {"on": 1.05, "off": 1.0}, launcher=0.05))
    live.add(_records(kinds, {"on": 1.06, "off": 1.0}, launcher=0.05))
    null.add(_records(kinds, {"on": 1.0, "off": 1.0}, launcher=0.03))
    s = lp.summary(live, null, block=10)
    step = 2.05 / 10  # the job's CPU per step in the off blocks: 2 ranks + the launcher
    assert s["step_ms"]["mean"] == pytest.approx(step * 1e3)
    assert s["launcher"]["mean"] == pytest.approx((0.005 - 0.003) / step * 100)
    assert s["threads"]["mean"] == pytest.approx(0.004 / 10 / step * 100)  # 2 ranks' threads per block of 10
    assert s["null"]["mean"] == pytest.approx(0.0)
    assert s["total"]["mean"] == pytest.approx(s["per_step"]["mean"] + s["launcher"]["mean"] + s["threads"]["mean"])
    assert s["total"]["half"] >= s["per_step"]["half"] > 0


def test_combine_adds_half_widths_in_quadrature() -> None:
    got = lp.combine({"n": 5, "mean": 1.0, "half": 3.0}, {"n": 9, "mean": 2.0, "half": 4.0},
                     {"n": 1, "mean": 0.5, "half": None})
    assert got == {"n": 1, "mean": 3.5, "half": pytest.approx(5.0)}
    assert lp.combine({"n": 0, "mean": None, "half": None})["mean"] is None
