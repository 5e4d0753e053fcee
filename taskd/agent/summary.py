"""What happened to a job, in the small vocabulary the agent and `taskd run` share."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskd.process.exitcodes import describe_returncode
from taskd.worker.live import SHARDS_LOST_EXIT
from taskd.worker.snapshot_account import Restored

if TYPE_CHECKING:
    from taskd.agent.ranks.launcher import Launcher

log = logging.getLogger("taskd.agent")


REFUSED = "refused"
"""A `FaultRecord`'s reason for a rank that exited refusing live recovery (`SHARDS_LOST_EXIT` after GAVE_UP): the
round goes on as after a fault (job-rescheduling), but the summary counts it as a refusal."""


@dataclass
class FaultRecord:
    time: float
    global_rank: int
    local_rank: int
    pid: int | None
    returncode: int | None
    reason: str  # "exit", "hang", ..., REFUSED

    @property
    def kind(self) -> str:
        """What the agent's event line calls it: a clean refusal of live recovery is no fault."""
        return "refusal" if self.reason == REFUSED else "fault"

    def describe(self) -> str:
        pid = f"pid {self.pid}" if self.pid else "no pid"
        if self.reason == REFUSED:
            what = f"refused live recovery: the shards it would need are lost (exit {SHARDS_LOST_EXIT})"
        elif self.reason == "hang":
            what = "stopped making progress (hang)"
        elif self.reason == "left":
            what = "left its group early (exit 0 before its loop's end)"
        elif self.reason == "retryable":
            what = "raised a retryable error (alive, paused: retry in place)"
        elif self.returncode is None:
            what = "ended (exit status unknown)"
        else:
            what = describe_returncode(self.returncode)
        return f"rank {self.global_rank} ({pid}) {what}"


# Where a recovery's resumption of training stands (RecoveryRecord.resumption). Only RESUMED makes its
# seconds "spent recovering": the others stop at the restart, which is not training again.
PENDING = "pending"  # being watched for in the ranks' heartbeat files
RESUMED = "resumed"  # every restarted rank reported a step of its new incarnation
NO_HEARTBEATS = "not reported: the ranks send no heartbeat steps"
SUPERSEDED = "not seen before the next fault"
ELSEWHERE = "not watched here: no rank of this node was restarted"
_NOT_SEEN = "not seen before the job ended"  # still PENDING when the summary is written


@dataclass
class RecoveryRecord:
    strategy: str
    ranks: list[int]
    started: float  # wall time of the restart (or, live, of the group's re-forming)
    restart_seconds: float  # fault -> `milestone`
    degraded: bool = False
    milestone: str = "rank(s) replaced"  # what had happened `restart_seconds` after the fault
    resumption: str = PENDING
    resumed_seconds: float | None = None  # fault -> training resumed, once RESUMED
    restored: str = ""  # where the restarted ranks restored from, as they told (`describe_restores`)

    @property
    def resumed(self) -> bool:
        return self.resumption == RESUMED

    @property
    def why_unresumed(self) -> str:
        return _NOT_SEEN if self.resumption == PENDING else self.resumption

    def resumed_at(self, seconds: float) -> None:
        self.resumed_seconds, self.resumption = seconds, RESUMED

    def describe(self) -> str:
        head = f"{self.strategy} of rank(s) {self.ranks}{' (degraded: no controller)' if self.degraded else ''}"
        if self.resumed:
            said = f"; {self.restored}" if self.restored else ""
            return f"{head}: {self.resumed_seconds:.3f}s from the fault to training resumed{said}"
        return (f"{head}: {self.restart_seconds:.3f}s from the fault to {self.milestone}; "
                f"training's resumption {self.why_unresumed}{f'; {self.restored}' if self.restored else ''}")


_SOURCE_WORDS = {"memory": "this node's memory", "buddy": "the buddy's copy", "persisted": "the persisted snapshots",
                 "disk": "disk",
                 "none": "nothing (a fresh start)"}


def describe_restores(restores: list[Restored]) -> str:
    """"rank(s) 0, 1 restored step 9 from the buddy's copy (node 1's agent), 1 step redone; ..." ("" for none)."""
    parts = []
    for source in ("buddy", "memory", "persisted", "disk", "none"):
        mine = [r for r in restores if r.source == source]
        for step in sorted({r.step for r in mine}):
            at = [r for r in mine if r.step == step]
            where = _SOURCE_WORDS[source] + (f" (node {at[0].holder}'s agent)" if source == "buddy" else "")
            what = f"step {step} from {where}" if step >= 0 else f"from {where}"
            redone = [r.redone for r in at if r.redone is not None]
            had = "it had reached" if source == "buddy" else "it held in memory"  # a lost rank: its last report
            tail = f", redoing the {max(redone)} newer step(s) {had}" if redone and source != "none" else ""
            parts.append(f"rank(s) {', '.join(str(r.rank) for r in at)} restored {what}{tail}")
    return "; ".join(parts)


@dataclass
class JobResult:
    """The outcome `start()` turns into an exit code and `taskd run` into its summary."""

    succeeded: bool = False
    exit_code: int = 0
    reason: str = ""
    ranks: int = 0
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)
    refusals: list[FaultRecord] = field(default_factory=list)  # ranks that refused live recovery cleanly (REFUSED)
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    first_failure: FaultRecord | None = None
    first_failure_log: list[str] = field(default_factory=list)
    # what the first failing rank recorded with torch's @record (the launcher's RankError), if anything
    first_failure_error: Any = None
    first_failure_captured: bool = False
    moved: str = ""  # this node's ranks moved to another agent (a node migration): said instead of "job succeeded"

    def add(self, record: FaultRecord) -> None:
        """A rank's end the round acts on: a fault, or a refusal, counted apart; the first of either is the first
        failure (the job's exit code, as before: a refusal follows the fault it could not recover)."""
        (self.refusals if record.reason == REFUSED else self.faults).append(record)
        if self.first_failure is None:
            self.first_failure = record

    def capture_first_failure(self, details: Launcher) -> None:
        """Read the first failure's log tail and @record error file from the failing incarnation itself.

        Called before any restart (which starts a new incarnation, and removes the error file) and
        at the end of the job; only the first call reads. `details` is the launcher (msrun's null
        object answers nothing): its `tail_log` and `error_report` (agent/ranks/launcher.py).
        """
        first = self.first_failure
        if first is None or self.first_failure_captured:
            return
        self.first_failure_captured = True
        try:
            self.first_failure_log = list(details.tail_log(first.local_rank, 20)) or self.first_failure_log
        except Exception as exc:
            log.debug("tail_log of rank %d: %s", first.global_rank, exc)
        try:
            self.first_failure_error = details.error_report(first.local_rank) or self.first_failure_error
        except Exception as exc:
            log.debug("error_report of rank %d: %s", first.global_rank, exc)

    @property
    def time_lost(self) -> float:
        """Seconds from fault to training resumed, over the recoveries whose resumption was seen."""
        return sum(r.resumed_seconds or 0.0 for r in self.recoveries if r.resumed)

    def _recovery_accounts(self) -> str:
        """"N recovery(ies), Xs spent recovering": only time up to a resumption that was seen counts as
        recovering; the rest is said for what it is (fault to restart, and why resumption is unknown)."""
        resumed = [r for r in self.recoveries if r.resumed]
        others = [r for r in self.recoveries if not r.resumed]
        text = f"{len(self.recoveries)} recovery(ies)"
        if not others:
            return f"{text}, {self.time_lost:.2f}s spent recovering"
        why = "; ".join(dict.fromkeys(r.why_unresumed for r in others))
        upto = "/".join(dict.fromkeys(r.milestone for r in others))
        restart = f"{sum(r.restart_seconds for r in others):.2f}s from fault to {upto}"
        if not resumed:
            return f"{text} (training's resumption {why}), {restart}"
        return (f"{text}, {self.time_lost:.2f}s spent recovering in {len(resumed)}, "
                f"{restart} in {len(others)} (training's resumption {why})")

    def _refusals(self) -> str:
        return f"{len(self.refusals)} rank(s) refused live recovery (shards lost), " if self.refusals else ""

    def format_summary(self) -> str:
        lines = self._root_cause() if not self.succeeded else []
        lines += [
            (f"{self.moved}: this agent ended cleanly" if self.succeeded and self.moved else "job succeeded"
             if self.succeeded else "node FENCED, its ranks stopped" if self.reason.startswith("fenced")
             else "job FAILED")  # a fenced or moved node's job goes on, or ended, without it: not this node's to judge
            + (f" ({self.reason})" if self.reason else "")
            + f": {self.ranks} ranks, {len(self.faults)} fault(s), {self._refusals()}{self._recovery_accounts()}, "
            f"{max(0.0, self.ended - self.started):.1f}s in all"
        ]
        lines.extend(f"  {rec.describe()}" for rec in self.recoveries)
        if not self.succeeded and self.first_failure is not None:
            lines.append(f"first failure: {self.first_failure.describe()}; exit code {self.exit_code}")
            if self.first_failure_log:
                lines.append(f"last lines of rank {self.first_failure.global_rank}'s log:")
                lines.extend(f"  | {line.rstrip()}" for line in self.first_failure_log)
        return "\n".join(lines)

    def _root_cause(self) -> list[str]:
        """torchrun's "root cause (first observed failure)": the rank's own @record report, shown first."""
        error, first = self.first_failure_error, self.first_failure
        if error is None or first is None:
            return []
        stamp = getattr(error, "timestamp", None)
        when = f" at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(stamp))}" if stamp else ""
        lines = [f"root cause (first observed failure): rank {first.global_rank}{when}: "
                 f"{getattr(error, 'exception', '') or 'no exception recorded'}"]
        traceback = str(getattr(error, "traceback", "") or "").rstrip("\n")
        lines.extend(f"  | {line}" for line in traceback.splitlines())
        return lines
