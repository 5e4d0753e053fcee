"""`taskd status` after a rerun under the same job id (issue 18, minor): the reset job's budget is this run's,
so the rounds listed next to it must be this run's; the earlier run's are summarised apart."""

from __future__ import annotations

from taskd.controller.status_view import render_text
from taskd.proto import recover_pb2, taskd_pb2


def job_list(events: list[tuple[float, str]], rounds: list[tuple[int, float]]) -> taskd_pb2.JobList:
    job = taskd_pb2.JobRecord(
        jobId="exp42", state="RUNNING", nodeCount=1, restarts=0, maxRestarts=3, createdAt=100.0, updatedAt=300.0,
        rounds=[taskd_pb2.RoundRecord(round=n, startedAt=t, endedAt=t + 1, outcome="recovered",
                                      strategy="job-rescheduling", strategiesTried=["job-rescheduling"],
                                      faultRanks=[recover_pb2.FaultRank(rankId="1", faultType="1")],
                                      durationSeconds=1.0) for n, t in rounds],
        events=[taskd_pb2.EventRecord(time=t, kind=k, round=0, detail="{}") for t, k in events])
    return taskd_pb2.JobList(status=recover_pb2.Status(code=0), jobs=[job])


def rounds_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  faults and recoveries"))
    rows = []
    for ln in lines[start + 1:]:
        if not ln.startswith("    "):
            break
        rows.append(ln.split()[0])
    return [r for r in rows if r != "round"]  # the table's header


def test_rerun_shows_no_round_of_the_previous_run_next_to_its_budget() -> None:
    text = render_text(job_list([(100.0, "job_created"), (150.0, "job_succeeded"), (200.0, "job_reset")],
                                [(1, 120.0)]))
    assert "restarts 0/3" in text
    assert "faults and recoveries of this run (since the job was reset at" in text
    assert rounds_table(text) == ["(none)"]
    assert "earlier runs of this job id: round 1, the last at" in text


def test_rerun_lists_only_its_own_rounds() -> None:
    text = render_text(job_list([(200.0, "job_reset"), (260.0, "job_reset")], [(1, 120.0), (2, 230.0), (3, 270.0)]))
    assert rounds_table(text) == ["3"]
    assert "earlier runs of this job id: rounds 1-2" in text


def test_first_run_is_shown_as_before() -> None:
    text = render_text(job_list([(100.0, "job_created")], [(1, 120.0)]))
    assert "  faults and recoveries:" in text and rounds_table(text) == ["1"]
    assert "earlier runs" not in text
