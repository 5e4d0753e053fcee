"""What happened to a job, in the small vocabulary the agent and `taskd run` share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from taskd.process.exitcodes import describe_returncode


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

    @property
    def time_lost(self) -> float:
        return sum(r.seconds for r in self.recoveries)

    def format_summary(self) -> str:
        lines = [
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
