"""`taskd status` lists standby agents as such: no node rank, no ranks of their own yet."""

from __future__ import annotations

from taskd.controller.status_view import render_text
from taskd.proto import taskd_pb2


def test_a_standby_is_listed_as_standby() -> None:
    job = taskd_pb2.JobRecord(jobId="j", state="RUNNING", nodeCount=2, ranksPerNode=2, agents=[
        taskd_pb2.AgentRecord(nodeRank=0, host="a", pid=10, subscribed=True),
        taskd_pb2.AgentRecord(nodeRank=0, host="spare", pid=30, subscribed=True, standby=True)])
    rows = [line.split() for line in render_text(taskd_pb2.JobList(jobs=[job])).splitlines()]
    assert ["0", "a", "10", "0-1"] == rows[[r[:1] for r in rows].index(["0"])][:4]
    assert ["standby", "spare", "30", "-"] == rows[[r[:1] for r in rows].index(["standby"])][:4]
