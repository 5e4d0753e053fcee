"""What happened to a job, in the small vocabulary the agent and `taskd run` share."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from taskd.process.exitcodes import describe_returncode

log = logging.getLogger("taskd.agent")


@dataclass
class FaultRecord:
    time: float
    global_rank: int
    local_rank: int
    pid: int | None
    returncode: int | None
    reason: str  # "exit", "hang", ...

    def describe(self) -> str:
        pid = f"pid {self.pid}" if self.pid else "no pid"
        if self.reason == "hang":
            what = "stopped making progress (hang)"
        elif self.reason == "retryable":
            what = "raised a retryable error (alive, paused: retry in place)"
        elif self.returncode is None:
            what = "ended (exit status unknown)"
        else:
            what = describe_returncode(self.returncode)
        return f"rank {self.global_rank} ({pid}) {what}"


@dataclass
class RecoveryRecord:
    strategy: str
    ranks: list[int]
    started: float
    seconds: float
    degraded: bool = False


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
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    first_failure: FaultRecord | None = None
    first_failure_log: list[str] = field(default_factory=list)
    # what the first failing rank recorded with torch's @record (the launcher's RankError), if anything
    first_failure_error: Any = None
    first_failure_captured: bool = False

    def capture_first_failure(self, details: Any) -> None:
        """Read the first failure's log tail and @record error file from the failing incarnation itself.

        Called before any restart (which starts a new incarnation, and removes the error file) and
        at the end of the job; only the first call reads. `details` is the launcher's extras (None
        under msrun), found by duck typing: `tail_log(local_rank, n)`, `error_report(local_rank)`.
        """
        first = self.first_failure
        if first is None or self.first_failure_captured or details is None:
            return
        self.first_failure_captured = True
        for name, args, attr in (("tail_log", (first.local_rank, 20), "first_failure_log"),
                                 ("error_report", (first.local_rank,), "first_failure_error")):
            reader = getattr(details, name, None)
            if not callable(reader):
                continue
            try:
                value = reader(*args)
            except Exception as exc:
                log.debug("%s of rank %d: %s", name, first.global_rank, exc)
                continue
            if value:
                setattr(self, attr, list(value) if attr == "first_failure_log" else value)

    @property
    def time_lost(self) -> float:
        return sum(r.seconds for r in self.recoveries)

    def format_summary(self) -> str:
        lines = self._root_cause() if not self.succeeded else []
        lines += [
            f"job {'succeeded' if self.succeeded else 'FAILED'}"
            + (f" ({self.reason})" if self.reason else "")
            + f": {self.ranks} ranks, {len(self.faults)} fault(s), {len(self.recoveries)} recovery(ies), "
            f"{self.time_lost:.2f}s spent recovering, {max(0.0, self.ended - self.started):.1f}s in all"
        ]
        for rec in self.recoveries:
            flag = " (degraded: no controller)" if rec.degraded else ""
            lines.append(f"  {rec.strategy} of rank(s) {rec.ranks} in {rec.seconds:.3f}s{flag}")
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
