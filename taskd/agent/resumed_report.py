"""Telling taskd's controller this node's ranks train again after a round (taskd.v1 `ReportResumed`, issue 17).

Only the agent sees training resume (its ranks' heartbeats, agent/live.py and agent/resumption.py); the
controller's round ended earlier, at the last recover status. The report goes through the node's report
queue (agent/reports.py), so it follows this node's recover status, as the controller needs; it says how
long ago training resumed when each attempt is built, so that one re-sent through a controller outage is
not counted late. It only informs: it is `lossy`, settled by the controller's first answer other than "busy"
(a refusal is logged) and by a controller that does not know the method, so that it never holds back a later
fault report; unanswered, it is re-sent until the controller timeout like any report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from taskd.agent.controller_link import ControllerLink
from taskd.agent.policy import ReportRetry
from taskd.agent.reports import Report
from taskd.client.manager import resumed_request

log = logging.getLogger("taskd.agent")

WHAT = "training resumed"


def report_resumed(link: ControllerLink, round_: int, seconds: float, at: float, unseen: bool = False,
                   clock: Callable[[], float] = time.monotonic) -> bool:
    """Queue the report (False without a controller to take it: degraded, a standby, fenced)."""
    if not link.active or link.fencing.fenced is not None:
        return False
    now = clock()
    if unseen:
        seconds, at = 0.0, now

    def build(client, _report: Report):  # noqa: ANN001, ANN202 - the outbox's builder signature
        return resumed_request(client, round_, seconds, max(0.0, clock() - at), unseen)

    link.outbox.add(Report(WHAT, "ReportResumed", build, ReportRetry(now + link.config.controller_timeout),
                           lossy=True))
    link.poll_reports(now)
    return True


__all__ = ["WHAT", "report_resumed"]
