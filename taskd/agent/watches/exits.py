"""How a rank's end is judged beyond its exit code: an error no restart mends, a live rank's early exit 0.

A rank's error that no restart can mend: the restart budget is for faults, not for bugs (issue 32, F8).

torchrun restarts whatever failed, and so did taskd: a script that raised at start ran 4 times before the job
failed, and a `LiveUsageError` (the script misuses `LiveGroup`) was restarted 3 times, its explanation under 4
tracebacks. Here the agent judges, from what it knows of its own ranks, whether a round's failures are the
script's own error; then it offers the controller no strategy that restarts a rank (only dump and exit), and the
job fails at once with one root cause.

What the agent knows of a failed rank (`RankEnd`):

- its error: the exception the rank recorded with torch's ``@record`` (its error file), else, when it exited 1
  (what Python's interpreter exits with for an uncaught exception) and its last output lines hold Python's
  ``Traceback (most recent call last):``, the traceback's exception line ("ValueError: bad"); a rank that
  printed one and then aborted (SIGABRT: torch's gloo teardown at interpreter exit) raised it too. A rank killed by a
  signal, or one that exited with a code of its own (``sys.exit(3)``), raised nothing: that is a fault;
- its progress: the step of its heartbeat file (``taskd.worker.heartbeat(step)``, `LiveGroup`), and whether any
  rank of this node has reported a step. A script that sends no heartbeats has no steps to judge by: for it,
  "before any rank completed a step" is judged by the rank's run time alone (`START_WINDOW`);
- how long its process ran.

The same error twice needs a step both times: without heartbeats, a survivor's "Connection closed by peer"
after each of two kills would read as one error repeated.

`BUG_RULES` is the policy, as data: a round is a bug when every failed rank of this node that the round names
matches a rule (a rank SIGKILLed beside one that raised makes it a fault). Faults of other nodes are their
agents' to judge. Nothing here touches a process: the facts are read by the caller (agent/round/actions.py).

A live group's rank that exits 0 before its loop ended: finished early, or left its group early?

Early stopping (every rank breaks out of ``live.steps()``) and a rank that leaves while its peers train on
(a ``return`` or ``sys.exit(0)`` of one rank) both exit 0 without the "loop complete" mark (Phase.COMPLETE).
Only the peers tell them apart: a group left early breaks, so its peers report the failed collective
(PAUSED) or sit in it. Without this watch the exit counted as a success and the peers waited out the
rejoin timeout for a generation nobody named (issue 21, "leaving early").

Local peers only: a rank whose group peers all run on other nodes is not judged here (docs/pytorch.md).
"""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from taskd.agent.ranks.table import Rank, RankState, RankTable
from taskd.worker.live import Phase, RankStatus

log = logging.getLogger("taskd.agent")

START_WINDOW = 30.0  # seconds: an error this soon after a rank's start, no step reported, is "at start"
# Python exits 1 after an uncaught exception; torch 2.13's gloo teardown can abort the interpreter after it printed
# the traceback (docs/pytorch.md, "Ending a DDP script"), so a SIGABRT after a traceback raised too
UNCAUGHT_EXITS = frozenset({1, -signal.SIGABRT})
_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torch's excepthook prefixes each traceback line after init_process_group
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class RankEnd:
    """What the agent knows of one failed rank when the round's strategies are offered."""

    global_rank: int
    pid: int | None  # its incarnation: an error counts as seen before only from another one
    error: str  # "ValueError: bad"; "" when the rank did not end with a Python exception
    step: int | None  # its heartbeat's last step; None when it reported none
    any_step: bool  # some rank of this node has reported a step
    ran: float  # seconds its process ran

    @property
    def error_type(self) -> str:
        """The exception's class name, without its module: "LiveUsageError"."""
        head = self.error.split(":", 1)[0].strip()
        return head.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class BugRule:
    """One kind of error a restart cannot mend: its name, when it applies (to the end and the errors seen at
    earlier rounds, as (error, step) pairs), and what the console says of it."""

    name: str
    applies: Callable[[RankEnd, frozenset[tuple[str, int | None]]], bool]
    says: str


BUG_RULES: tuple[BugRule, ...] = (
    BugRule("live-usage", lambda e, seen: e.error_type == "LiveUsageError",
            "the script misuses LiveGroup (LiveUsageError): a restart runs the same code"),
    BugRule("before-any-step", lambda e, seen: bool(e.error) and not e.any_step and e.ran < START_WINDOW,
            "it raised before any rank completed a step"),
    BugRule("same-error-twice", lambda e, seen: bool(e.error) and e.step is not None and (e.error, e.step) in seen,
            "it raised the same error at the same step as before a restart"),
)


@dataclass(frozen=True)
class Bug:
    """A round's failures judged the script's own: the rank that shows it, and the rule."""

    end: RankEnd
    rule: BugRule

    def describe(self) -> str:
        e = self.end
        where = f"at step {e.step}" if e.step is not None else f"{e.ran:.1f}s after its start, no step reported"
        return (f"rank {e.global_rank} raised {e.error} ({where}): {self.rule.says}. A bug in the script, not a "
                "fault: it is not restarted (the restart budget is for faults), the job fails")


def error_of(returncode: int | None, recorded: str, tail: Iterable[str]) -> str:
    """The exception a rank ended with: the @record one (`recorded`), else, when it exited as an uncaught exception
    leaves Python (`UNCAUGHT_EXITS`), the exception line of the last Python traceback in its output (the first
    unindented line after the header); "" when it raised nothing that can be seen."""
    if recorded:
        return recorded.strip()
    if returncode not in UNCAUGHT_EXITS:
        return ""
    lines = [_PREFIX.sub("", line).rstrip() for line in tail]
    heads = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not heads:
        return ""
    for line in lines[heads[-1] + 1:]:
        if line and not line[0].isspace():
            return line.strip()
    return ""


class BugJudge:
    """The errors of earlier incarnations, and the verdict on this round."""

    def __init__(self, rules: tuple[BugRule, ...] = BUG_RULES) -> None:
        self.rules = rules
        self._seen: dict[tuple[str, int | None], set[int | None]] = {}  # (error, step) -> the pids that raised it

    def judge(self, ends: list[RankEnd]) -> Bug | None:
        """A bug when every end matches a rule (the first rule of the first end names it); the ends' errors are
        remembered for the next rounds either way. A round offered twice judges the same pids twice: no match
        with itself."""
        pids = {e.pid for e in ends}
        seen = frozenset(key for key, raised in self._seen.items() if raised - pids)
        for e in ends:
            if e.error:
                self._seen.setdefault((e.error, e.step), set()).add(e.pid)
        found = []
        for end in ends:
            rule = next((r for r in self.rules if r.applies(end, seen)), None)
            if rule is None:
                return None
            found.append(Bug(end, rule))
        return found[0] if found else None


WATCH = 10.0  # seconds after the exit in which the peers' breaking group counts as evidence
HOLD = 1.0  # a peer inside a collective this long since the exit waits on the one that left


@dataclass(frozen=True)
class Departure:
    rank: Rank
    pid: int
    step: int | None  # its last completed step
    at: float  # time.time() of the exit: compared with the peers' own collective marks (their wall clock)
    until: float  # time.monotonic() after which the peers' silence makes it a finish (WATCH): no wall-clock step


class DepartureWatch:
    """Exits 0 of group ranks before their loop's end, judged by what their local peers do next."""

    def __init__(self, table: RankTable) -> None:
        self.table = table
        self._open: dict[int, Departure] = {}  # local rank -> its exit

    def exited(self, rank: Rank, status: RankStatus | None, in_group: bool, now: float | None = None,
               mono: float | None = None) -> bool:
        """Note a rank's exit 0; True when it is one to watch (a group rank whose loop had not ended)."""
        if status is None or not in_group or not status.can_rejoin or status.phase is Phase.COMPLETE \
                or rank.pid is None:
            return False
        if not any(r.local_rank != rank.local_rank for r in self.table.in_state(RankState.RUNNING)):
            return False  # the last one out: nobody to leave
        self._open[rank.local_rank] = Departure(rank, rank.pid, status.heartbeat.step,
                                                time.time() if now is None else now,
                                                (time.monotonic() if mono is None else mono) + WATCH)
        log.info("rank %d (pid %d) exited 0 before its loop's end (last step %s): its peers tell whether it left "
                 "them or the job stops early", rank.global_rank, rank.pid, status.heartbeat.step)
        return True

    @property
    def watching(self) -> bool:
        return bool(self._open)

    def left(self, peers: dict[int, RankStatus], now: float | None = None,
             mono: float | None = None) -> list[tuple[Departure, str]]:
        """The departures their peers' broken group gives away, with why; ``peers`` are the running ranks'
        statuses by local rank. Each departure is judged once: given away, or dropped after WATCH."""
        if not self._open:
            return []
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        found = []
        for local_rank, d in list(self._open.items()):
            if d.rank.pid != d.pid or d.rank.state is not RankState.SUCCEEDED:
                del self._open[local_rank]  # restarted, or already judged otherwise
                continue
            paused = sorted(self.table[lr].global_rank for lr, s in peers.items() if s.phase is Phase.PAUSED)
            waiting = sorted(self.table[lr].global_rank for lr, s in peers.items() if s.collective_since is not None
                             and now - max(s.collective_since, d.at) >= HOLD)
            if paused or waiting:
                del self._open[local_rank]
                whom = f"rank(s) {paused} lost their group" if paused else f"rank(s) {waiting} wait on it"
                found.append((d, f"it exited 0 after step {d.step}, before its loop's end, and {whom}"))
            elif mono >= d.until or not peers:
                del self._open[local_rank]
                log.debug("rank %d exited early: its peers trained on or ended; it finished", d.rank.global_rank)
        return found


__all__ = ["BUG_RULES", "START_WINDOW", "UNCAUGHT_EXITS", "Bug", "BugJudge", "BugRule", "Departure", "DepartureWatch",
           "RankEnd", "error_of"]
