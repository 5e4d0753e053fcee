"""What one job may store and log: a quota in bytes, and log lines per job per window (issue 31, F5).

The state file and the log are every job's. Before, a holder of one job's credential grew them without
bound: `Init` without `ranksPerNode`, then fault reports naming ranks 0..99,999, each adding ~7 MB of state
and WAL and a ~790 KB log line, all answered 0. Now a fault text names runs of ranks as ranges
(model.fmt_faults), a report writes at most `FAULT_ROWS_PER_REPORT` fault rows (store.py), and:

- **per report**: at most `MAX_FAULT_RUNS` runs of consecutive ranks, with the open round's (service/servicers.py);
- **quota**: the bytes a job holds in the state file (its snapshot, its events, fault rows and rounds' fault
  texts, as `Store.job_bytes` counts them) are counted; a call whose change would take the job past
  `--max-job-bytes` is refused (`QUOTA_EXCEEDED`, 413, naming the flag and the figures) and undone, so nothing
  changed. Events that end or time things (an agent's finish, a lost stream, the timers) and a stream
  opening are never refused: a job at its quota still ends, and its agents still hear their signals. Its
  stream history (soft records) past the quota is dropped instead of written;
- **log**: at most `lines` history lines per job every `window` seconds, each at most `LOG_DETAIL_CHARS`
  of detail; the lines held back are counted in the job's next line.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable

from taskd.controller.machine.events import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    JoinDue,
    LastCallDue,
    Outcome,
    Record,
    RejoinDue,
    StandbyDisconnected,
    StreamEndedDue,
    Tick,
)
from taskd.vocabulary import Code

history_log = logging.getLogger("taskd.controller.core")  # the job history lines, where they always were

NEVER_REFUSED = (AgentFinished, AgentConnected, AgentDisconnected, StandbyDisconnected, Tick, AgentLossDue,
                 StreamEndedDue, RejoinDue, JoinDue, LastCallDue)
"""Events a job past its quota still takes (and is charged for): what ends a job, tells it an agent is gone,
or opens the stream its signals go out on. Every other event is refused when its change would pass the quota."""

EVENT_ROW = 64
"""Bytes an `events` row costs beyond its detail (ids, times, kind, index entries), as `Store.job_bytes` counts."""
FAULT_ROW = 48
"""Bytes a `faults` row costs beyond its detail and action text."""
FAULT_ROWS_PER_REPORT = 256
"""`faults` rows one fault report writes at most (one per rank, lowest first, store.py); the report's event holds
every rank, as ranges. 100,000 ranks in one report wrote 100,000 rows, ~7 MB of the state file (issue 31, F5)."""
MAX_FAULT_RUNS = 4096
"""Runs of consecutive ranks one fault report may name, with its job's open round (servicers.py; 409 past it): what a
report costs grows with the runs, so this bounds it (~40 KB of fault text) whatever the ranks' count. A node's
report names its own ranks, so any node of up to 4096 ranks is within it."""
ROUND_TEXT_KINDS = frozenset({"round_started"})
"""Records whose fault text also goes into a new round row (a merge rewrites that row's text: not added)."""
LOG_DETAIL_CHARS = 2048
"""A history log line's detail past this many characters is cut, with its full length said."""


def record_bytes(rec: Record) -> int:
    """What `rec` adds to the state file, counted as `Store.job_bytes` counts the rows it writes."""
    d = rec.detail
    size = EVENT_ROW + len(rec.detail_json)
    faults = d.get("faults", "") if isinstance(d.get("faults"), str) else ""
    if rec.kind == "fault_reported" and faults:
        rows = _rank_count(faults, FAULT_ROWS_PER_REPORT)
        size += rows * (FAULT_ROW + len(str(d.get("detail", ""))) + len(str(d.get("action", ""))))
    elif rec.kind in ROUND_TEXT_KINDS:
        size += len(faults)
    return size


def _rank_count(text: str, cap: int) -> int:
    """The ranks `text` names, counted no further than `cap` (a report's fault rows stop there; counting all of
    4096 runs took ~6 ms, twice per report: its refusal and its charge)."""
    n = 0
    for item in filter(None, text.split(",")):
        ranks = item.partition(":")[0]
        first, _, last = ranks.partition("-")
        try:
            n += int(last or first) - int(first) + 1
        except ValueError:
            n += 1
        if n >= cap:
            return cap
    return n


class JobQuota:
    """Bytes each job holds in the state file (`used`), and whether a change may add more."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes  # 0 = no quota
        self.used: dict[str, int] = {}
        self.refused = 0

    def refusal(self, job_id: str, event: object, records: Iterable[Record], snapshot: int = 0) -> str:
        """"" when the change may be stored; else why not (the job's figures and the flag). `snapshot`: the
        length of the job's stored snapshot, counted with its history."""
        if not self.max_bytes or isinstance(event, NEVER_REFUSED):
            return ""
        added = sum(record_bytes(rec) for rec in records)
        used = self.used.get(job_id, 0) + snapshot
        if not added or used + added <= self.max_bytes:
            return ""
        self.refused += 1
        return (f"job {job_id} holds {used} bytes of state and history, and this change would add {added}: past its "
                f"quota of {self.max_bytes} bytes (--max-job-bytes); nothing changed. Name fewer ranks per report "
                "(ranges of consecutive ranks cost as one), or run under a new job id")

    def over(self, job_id: str, snapshot: int = 0) -> bool:
        return bool(self.max_bytes) and self.used.get(job_id, 0) + snapshot >= self.max_bytes

    def charge(self, job_id: str, records: Iterable[Record]) -> None:
        self.used[job_id] = self.used.get(job_id, 0) + sum(record_bytes(rec) for rec in records)

    def forget(self, job_id: str) -> None:
        self.used.pop(job_id, None)


class JobLog:
    """At most `lines` history log lines per job every `window` seconds (0 = no limit)."""

    def __init__(self, lines: int, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.lines = lines
        self.window = window
        self.clock = clock
        self._open: dict[str, tuple[float, int]] = {}  # job -> (window start, lines in it)
        self._held: dict[str, int] = {}

    def allow(self, job_id: str) -> tuple[bool, int]:
        """(log this line?, lines of this job held back since its last line)."""
        if not self.lines:
            return True, 0
        now = self.clock()
        start, n = self._open.get(job_id, (now, 0))
        if now - start >= self.window:
            start, n = now, 0
        if n >= self.lines:
            self._open[job_id] = (start, n)
            self._held[job_id] = self._held.get(job_id, 0) + 1
            return False, 0
        self._open[job_id] = (start, n + 1)
        return True, self._held.pop(job_id, 0)

    def forget(self, job_id: str) -> None:
        self._open.pop(job_id, None)
        self._held.pop(job_id, None)


def log_detail(detail: object) -> str:
    """The detail as a log line shows it: JSON, cut past LOG_DETAIL_CHARS."""
    text = json.dumps(detail)
    if len(text) <= LOG_DETAIL_CHARS:
        return text
    return f"{text[:LOG_DETAIL_CHARS]}... ({len(text)} characters)"


class JobLimits:
    """The core's one handle on both: refuse a change past the quota, charge a stored one, log its history."""

    def __init__(self, max_bytes: int, log_lines: int, snapshot_bytes: dict[str, int]) -> None:
        self.quota = JobQuota(max_bytes)
        self.log = JobLog(log_lines)
        self._snapshots = snapshot_bytes  # the store's: job id -> its stored snapshot's length

    def refused(self, job_id: str, event: object, out: Outcome) -> Outcome | None:
        """The answer to a change past the job's quota (the caller undoes it), else None."""
        why = self.quota.refusal(job_id, event, out.records, self._snapshots.get(job_id, 0))
        if not why:
            return None
        ok, held = self.log.allow(job_id)
        if ok:
            history_log.warning("job %s: %s refused: %s%s", job_id, type(event).__name__, why, _held(held))
        return Outcome(code=Code.QUOTA_EXCEEDED, info=why)

    def keeps_soft(self, job_id: str) -> bool:
        """Whether the job's stream history is still written (not once it is at its quota)."""
        return not self.quota.over(job_id, self._snapshots.get(job_id, 0))

    def stored(self, job_id: str, out: Outcome, unlogged: Collection[str], soft: Collection[str] = ()) -> None:
        """Charge what was stored, and log it (rate-limited per job, each line's detail bounded). An outcome of
        `soft` records only, without signals, was dropped rather than batched if the job is at its quota (the core's
        `_defer_soft` asked `keeps_soft` just before): not charged then."""
        records = out.records
        if not (not out.signals and all(rec.kind in soft for rec in records) and not self.keeps_soft(job_id)):
            self.quota.charge(job_id, records)
        for rec in records:
            if rec.kind in unlogged:
                continue
            ok, held = self.log.allow(job_id)
            if ok and history_log.isEnabledFor(logging.INFO):  # the line's JSON only for a line that is written
                history_log.info("job %s round %d: %s %s%s", job_id, rec.round, rec.kind, log_detail(rec.detail),
                                 _held(held))

    def note(self, job_id: str, logger: logging.Logger, msg: str, *args: object) -> None:
        """An info line about the job (a refused call), within the job's log budget."""
        ok, held = self.log.allow(job_id)
        if ok:
            logger.info(msg + _held(held), *args)

    def forget(self, job_id: str) -> None:
        self.quota.forget(job_id)
        self.log.forget(job_id)


def _held(n: int) -> str:
    return f" ({n} earlier line(s) of this job not shown: --max-job-log-lines)" if n else ""
