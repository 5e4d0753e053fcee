"""bench/goodput.py's verdicts: a goal is met or missed only beyond the fault-free runs' spread, else the bench
says it cannot tell and by how much; the goal run's plan; --table over the older result format."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.bench import load_bench

gv = load_bench("goodput_verdict")
plan = load_bench("goodput_plan")

LIVE, TORCHRUN, TORCHFT = "taskd live + script-mode spare", "torchrun + X", "torchft, Manager.allreduce"


def _run(label: str, seconds: float, faults: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    return {"system": label, "seconds": seconds, "ok": True, "faulted": faults is not None, "faults": faults or [],
            **kw}


def _fault(kind: str, resumed: float) -> dict[str, Any]:
    return {"kind": kind, "rank": 1, "at": 10.0, "resumed_s": resumed}


def _row(label: str, refs: list[float], with_faults: float, faults: list[dict[str, Any]], peer: bool,
         redone: int = 0) -> dict[str, Any]:
    run = _run(label, with_faults, faults, redone={0: redone})
    return gv.row(label, peer, [_run(label, s) for s in refs], run, 900.0)


def test_a_verdict_needs_a_margin_beyond_the_spread() -> None:
    assert gv.judge(2.1, 2.0).verdict == "met"
    assert gv.judge(-2.1, 2.0).verdict == "missed"
    assert gv.judge(2.0, 2.0).verdict == gv.judge(-1.0, 2.0).verdict == "cannot tell"  # not beyond it
    assert gv.judge(50.0, None).verdict == "cannot tell"  # one fault-free run: no spread, no verdict
    assert "short by 1.5 s" in gv.judge(0.5, 2.0).says()
    assert "missed by 3.0 s" in gv.judge(-3.0, 1.0).says()
    assert "--baseline-runs 2" in gv.judge(4.0, None).says()


def test_the_spread_is_the_range_and_at_least_the_runs_median() -> None:
    assert gv.spread([50.0, 52.5, 51.0]) == 2.5 and gv.spread([50.0]) is None
    assert gv.noise_floor([1.0, None, 3.0, 8.0]) == 3.0 and gv.noise_floor([None]) is None
    assert gv.effective_spread(0.2, 3.0) == 3.0  # two runs that agree by luck do not make a sharp verdict
    assert gv.effective_spread(8.0, 3.0) == 8.0 and gv.effective_spread(None, 3.0) == 3.0
    assert gv.effective_spread(None, None) is None


def test_a_row_is_the_mean_of_its_fault_free_runs() -> None:
    r = _row(LIVE, [100.0, 104.0], 105.0, [_fault("kill", 0.5)], peer=False)
    assert r["fault_free_s"] == 102.0 and r["fault_free_spread_s"] == 4.0 and r["lost_s"] == 3.0
    assert r["goodput"] == pytest.approx(102.0 / 105.0) and r["ok"]
    failed = gv.row(LIVE, False, [_run(LIVE, 100.0), {**_run(LIVE, 80.0), "ok": False}], _run(LIVE, 105.0, []), 900.0)
    assert failed["fault_free_s"] is None and failed["goodput"] is None  # a failed reference is not noise


def test_the_quiet_runs_noise_gives_no_verdict() -> None:
    """The 2026-12-04 quiet run's shape: fault-free runs 8 s apart, taskd live's fault 0.5 s: above 100 % goodput."""
    rows = [_row(LIVE, [55.9, 47.9], 52.8, [_fault("kill", 0.5)], peer=False),
            _row(TORCHFT, [52.8, 50.0], 51.0, [_fault("kill", 2.7)], peer=True),
            _row(TORCHRUN, [47.9, 49.0], 56.0, [_fault("kill", 6.9)], peer=True, redone=28)]
    v = gv.compare(rows)
    assert v["floor_s"] == pytest.approx(2.8) and rows[0]["spread_s"] == pytest.approx(8.0)
    assert rows[2]["spread_s"] == pytest.approx(2.8)
    assert v["best"] is rows[0] and v["best_peer"] is rows[1]
    assert v["goodput"].verdict == v["peer"].verdict == "cannot tell"
    assert v["goodput"].margin == pytest.approx(51.9 / 0.97 - 52.8)
    assert v["goodput"].spread == pytest.approx(8.0 / 0.97)
    assert v["qualifies"].verdict == "missed"  # torchrun at ~87 %, beyond its spread: not the goal run
    assert rows[0]["lost_over_best_peer"] is None  # torchft lost < 0 s: no ratio to it
    lines = gv.verdict_lines(v)
    assert "cannot tell" in lines[0] and "no, the run does not qualify" in lines[2]


def test_a_goal_run_with_clear_margins_gets_verdicts() -> None:
    rows = [_row(LIVE, [120.0, 121.0], 122.5, [_fault("kill", 0.5), _fault("hang", 1.4)], peer=False),
            _row(TORCHFT, [126.0, 127.0], 138.0, [_fault("kill", 2.7), _fault("hang", 8.0)], peer=True),
            _row(TORCHRUN, [119.0, 120.0], 170.0, [_fault("kill", 8.0), _fault("hang", 38.0)], peer=True)]
    v = gv.compare(rows)
    assert v["goodput"].verdict == "met" and v["goodput"].margin == pytest.approx(120.5 / 0.97 - 122.5)
    peer = v["peer"]  # 0.5 x 11.5 - 2.0 = 3.75 s against 1.0 + 0.5 x 1.0 = 1.5 s
    assert peer.verdict == "met" and peer.margin == pytest.approx(3.75) and peer.spread == pytest.approx(1.5)
    assert v["qualifies"].verdict == "met" and v["qualifies"].margin == pytest.approx(170.0 - 119.5 / 0.8)
    assert "yes, the run qualifies" in gv.verdict_lines(v)[2]
    slow = _row(LIVE, [120.0, 121.0], 130.0, [_fault("hang", 9.0)], peer=False)
    v = gv.compare([slow, rows[1], rows[2]])
    assert v["goodput"].verdict == "missed" and "missed by 5.8 s" in gv.verdict_lines(v)[0]
    text = gv.breakdown(slow, 480, 4, 3.0, v["fastest"])
    assert "detection ~3.0 s (1 hangs x 3 s timeout" in text and "pause 6.0 s" in text
    assert "outside recoveries 0.5 s" in text and "stalled" not in text
    stuck = gv.row(TORCHFT, True, [_run(TORCHFT, 120.0)], {**_run(TORCHFT, 0.0, [_fault("kill", 3.0),
                   {"kind": "hang", "rank": 3, "at": 20.0}]), "ok": False, "stopped_at_s": 270.0,
                   "error": "the job did not end within --run-timeout 270 s"}, 270.0)
    assert stuck["bound"] and stuck["lost_s"] == 150.0 and stuck["unresumed"] == 1
    assert "1 of its faults never saw every rank past its next step (the job stalled there until --run-timeout)" \
        in gv.breakdown(stuck, 480, 4, 5.0, None)
    seen = _row(LIVE, [120.0, 121.0], 130.0, [{**_fault("hang", 9.0), "detected_s": 2.4}], peer=False)
    text = gv.breakdown(seen, 480, 4, 3.0, None)  # the agent's own record of the fault, not the setting
    assert "detection 2.4 s (measured" in text and "pause 6.6 s" in text


def test_the_estimate_follows_the_schedule_and_each_systems_fault_cost() -> None:
    s = {**plan.GOAL, "steps": 450, "mtbf": 40.0}
    free = plan.STARTUP_S + 450 * plan.STEP_S
    assert plan.fault_cost(LIVE, "kill", s) == 0.5
    stopped = plan.STOPPED_AFTER + plan.STOP_LOOK / 2  # a stopped rank, told by its state
    assert plan.fault_cost(LIVE, "hang", s) == 0.5 + stopped
    assert plan.fault_cost(LIVE, "hang", {**s, "heartbeat_timeout": 0.5}) == 0.5 + 0.5 + plan.MONITOR_S
    assert plan.fault_cost(TORCHRUN, "hang", s) == pytest.approx(7.0 + 4.5 * plan.STEP_S + 30.0)
    est = plan.estimate([LIVE, TORCHRUN, "nvrx"], s, [(50.0, "kill"), (100.0, "hang"), (140.0, "kill")])
    live, torchrun, unknown = (est["systems"][k] for k in (LIVE, TORCHRUN, "nvrx"))
    assert (live["faults"], live["with_faults_s"]) == (2, pytest.approx(free + 0.5 + 0.5 + stopped))
    assert torchrun["faults"] == 3 and torchrun["goodput"] < 0.8
    assert not unknown["known"] and unknown["with_faults_s"] == free
    assert est["total_s"] == pytest.approx(sum(2 * free + r["with_faults_s"] for r in est["systems"].values()))
    stalled = plan.estimate([TORCHFT], s, [(50.0, "kill"), (100.0, "hang")])["systems"][TORCHFT]
    assert plan.fault_cost(TORCHFT, "hang", s) == float("inf")  # nothing replaces its stopped replica
    assert (stalled["faults"], stalled["with_faults_s"], stalled["stalls"]) == (2, s["run_timeout"], True)


def test_the_goal_preset_fits_its_time_and_takes_torchrun_below_80_percent(monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "argv", ["goodput.py"])
    goodput = load_bench("goodput")
    g = plan.GOAL
    faults = goodput.fault_schedule(g["seed"], g["ranks"], g["mtbf"], g["hang_share"], g["run_timeout"], 1000)
    assert [(f.kind, f.rank, round(f.at)) for f in faults[:4]] == \
        [("hang", 2, 39), ("kill", 2, 72), ("kill", 0, 119), ("hang", 3, 153)]  # as the comment says
    free = plan.STARTUP_S + g["steps"] * plan.STEP_S
    assert {f.kind for f in faults if f.at < free} == {"hang", "kill"}, "every system meets a hang and a kill"
    for seed in range(1, g["seed"]):  # the first seed that does, by the rule
        early = goodput.fault_schedule(seed, g["ranks"], g["mtbf"], g["hang_share"], g["run_timeout"], 1000)
        assert {f.kind for f in early if f.at < free} != {"hang", "kill"}, seed
    labels = [s.label for s in goodput.SYSTEMS if any(s.label.startswith(p) for p in g["systems"].split(","))]
    assert len(labels) == 4
    est = plan.estimate(labels, g, [(f.at, f.kind) for f in faults])
    assert 20 * 60 < est["total_s"] < 30 * 60
    assert est["systems"][goodput.TORCHRUN]["goodput"] < 0.8


def test_table_reprints_both_result_formats(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(sys, "argv", ["goodput.py"])
    goodput = load_bench("goodput")
    settings = {"ranks": 4, "steps": 200, "mtbf": 30.0, "seed": 2, "hang_share": 0.25, "heartbeat_timeout": 5.0,
                "pg_timeout": 30.0, "torchft_timeout": 5, "run_timeout": 300.0}
    faulted = {"faults": [_fault("kill", 0.5)], "redone": {"0": 0}, "bit_identical": True, "leftovers": []}
    old = {"settings": settings, "skipped": {}, "runs": [  # one fault-free run, then the run with faults
        _run(goodput.LIVE, 50.0), _run(goodput.LIVE, 51.0, **faulted),
        _run(goodput.TORCHRUN, 48.0), _run(goodput.TORCHRUN, 58.0, **faulted)]}
    new = {**old, "settings": {**settings, "baseline_runs": 2}, "runs": [
        _run(goodput.LIVE, 50.0), _run(goodput.LIVE, 51.0, **faulted), _run(goodput.LIVE, 49.0),
        _run(goodput.TORCHRUN, 48.0), _run(goodput.TORCHRUN, 58.0, **faulted), _run(goodput.TORCHRUN, 47.0)]}
    for data, spread_col in ((old, "| -"), (new, "| 1.00")):
        path = tmp_path / "goodput.json"
        path.write_text(json.dumps(data))
        assert goodput.reprint(path) == 0
        out = capsys.readouterr().out
        live = next(line for line in out.splitlines() if line.startswith(f"| {goodput.LIVE}"))
        assert spread_col in live, live
        assert "goal, taskd's best (taskd live + script-mode spare)" in out
    assert "97.1 % ± 2.0" in out  # 49.5 / 51, ± the larger of its spread and the median one (1.0) / 51


def test_goal_sets_the_plan_flags_override_and_a_used_keep_dir_is_refused(tmp_path: Path, monkeypatch: Any,
                                                                         capsys: Any) -> None:
    monkeypatch.setattr(sys, "argv", ["goodput.py"])
    goodput = load_bench("goodput")
    monkeypatch.setattr(sys, "argv", ["goodput.py", "--goal", "--seed", "7"])
    args = goodput.parse_args()
    assert (args.steps, args.mtbf, args.baseline_runs, args.systems, args.seed) == \
        (plan.GOAL["steps"], plan.GOAL["mtbf"], 2, plan.GOAL["systems"], 7)
    monkeypatch.setattr(sys, "argv", ["goodput.py", "--quick"])
    assert goodput.parse_args().baseline_runs == 1
    (tmp_path / "taskd-0-ref0").mkdir()  # a previous run's files: the new runs' directories would collide
    monkeypatch.setattr(sys, "argv", ["goodput.py", "--goal", "--keep", str(tmp_path)])
    with pytest.raises(SystemExit):
        goodput.parse_args()
    assert "holds files already" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["taskd-0-ref0"]  # nothing changed
