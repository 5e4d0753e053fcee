"""What one job may store and log (quota.py, issue 31 F5): ranges of ranks, the bytes a change adds, the quota's
refusal and what it never refuses, and the per-job log budget."""

from __future__ import annotations

import logging

import pytest

from taskd.controller.machine.events import AgentFinished, FaultReported, Outcome, Record, Tick
from taskd.controller.machine.model import fault_runs, fmt_faults
from taskd.controller.storage.quota import (
    FAULT_ROWS_PER_REPORT,
    LOG_DETAIL_CHARS,
    JobLimits,
    JobLog,
    JobQuota,
    log_detail,
    record_bytes,
)
from taskd.controller.storage.store import parse_fault_ranges, parse_fault_text
from taskd.vocabulary import Code


def test_consecutive_ranks_of_one_type_are_one_range_and_parse_back() -> None:
    faults = {r: "1" for r in range(100_000)}
    assert fmt_faults(faults) == "0-99999:1"
    mixed = {0: "1", 1: "1", 2: "0", 5: "1", 6: "1", 7: "1", 9: "2"}
    text = fmt_faults(mixed)
    assert text == "0-1:1,2:0,5-7:1,9:2"
    assert dict(parse_fault_text(text)) == mixed
    assert parse_fault_ranges(text) == [(0, 1, "1"), (2, 2, "0"), (5, 7, "1"), (9, 9, "2")]
    assert parse_fault_text("3:1,4:0") == [(3, "1"), (4, "0")]  # the older per-rank form still parses
    assert len(fault_runs({r: "1" for r in range(0, 200, 2)})) == 100


def test_what_a_fault_report_adds_grows_with_its_runs_not_its_ranks() -> None:
    def report(faults: dict[int, str]) -> Record:
        return Record("fault_reported", 1, {"node_rank": 0, "faults": fmt_faults(faults), "detail": "d",
                                            "action": "opened"})

    whole = record_bytes(report({r: "1" for r in range(100_000)}))
    few = record_bytes(report({r: "1" for r in range(300)}))
    assert abs(whole - few) < 8  # one range either way ("0-99999" vs "0-299"); fault rows stop at 256
    assert whole < 20_000
    sparse = record_bytes(report({r: "1" for r in range(0, 8000, 2)}))
    assert sparse > whole and sparse < 100_000  # 4000 runs: ~40 KB of text
    assert FAULT_ROWS_PER_REPORT == 256


def test_a_change_past_the_quota_is_refused_and_ends_and_timers_never_are() -> None:
    q = JobQuota(10_000)
    rec = Record("fault_reported", 1, {"faults": fmt_faults({r: "1" for r in range(0, 2000, 2)}), "detail": "",
                                       "action": "opened", "node_rank": 0})
    fault = FaultReported(node_rank=0, faults={0: "1"})
    assert q.refusal("j", fault, [rec]) != ""  # ~9 KB of text plus 256 fault rows: past 10 KB at once
    small = Record("fault_reported", 1, {"faults": "0:1", "detail": "", "action": "opened", "node_rank": 0})
    assert q.refusal("j", fault, [small]) == ""
    q.charge("j", [small] * 60)
    why = q.refusal("j", fault, [small])
    assert "past its quota of 10000 bytes (--max-job-bytes); nothing changed" in why and "job j holds" in why
    assert q.refusal("j", AgentFinished(node_rank=0, exit_code=0), [small]) == ""  # a job at its quota still ends
    assert q.refusal("j", Tick(), [small]) == ""
    assert q.refusal("j", fault, []) == ""  # a change that adds nothing (an idempotent repeat) is never refused
    assert q.refusal("other", fault, [small]) == ""  # the quota is per job
    assert q.over("j") or q.used["j"] < 10_000
    assert JobQuota(0).refusal("j", fault, [rec] * 1000) == ""  # 0 = no quota


def test_job_limits_answer_413_and_count_the_snapshot() -> None:
    snapshots = {"j": 9_950}
    limits = JobLimits(10_000, 0, snapshots)
    out = Outcome(records=[Record("agent_registered", 0, {"node_rank": 0, "host": "h"})])
    refused = limits.refused("j", FaultReported(node_rank=0, faults={}), out)
    assert refused is not None and refused.code == Code.QUOTA_EXCEEDED
    snapshots["j"] = 100
    assert limits.refused("j", FaultReported(node_rank=0, faults={}), out) is None


def test_log_lines_are_limited_per_job_and_the_held_ones_counted() -> None:
    now = [0.0]
    lg = JobLog(3, window=10.0, clock=lambda: now[0])
    assert [lg.allow("a")[0] for _ in range(5)] == [True, True, True, False, False]
    assert lg.allow("b") == (True, 0)  # another job has its own budget
    now[0] = 10.0
    assert lg.allow("a") == (True, 2)  # the next line says how many were not shown
    assert JobLog(0).allow("a") == (True, 0)


def test_a_huge_detail_is_cut_in_its_log_line(caplog: pytest.LogCaptureFixture) -> None:
    text = log_detail({"faults": ",".join(f"{r}:1" for r in range(0, 200_000, 2))})
    assert len(text) < LOG_DETAIL_CHARS + 40 and text.endswith("characters)")
    limits = JobLimits(0, 2, {})
    with caplog.at_level(logging.INFO, logger="taskd.controller.core"):
        limits.stored("j", Outcome(records=[Record("fault_reported", 1, {"faults": "0:1"})] * 5), frozenset())
    assert len([r for r in caplog.records if "job j round 1" in r.getMessage()]) == 2
