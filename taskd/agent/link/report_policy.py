"""Every report the agent sends, as data: one retry policy for all, and a table of what differs between kinds.

The agent has one way to tell the controller anything: a report in its outbox (agent/link/reports.py), sent one
attempt at a time from its loop, re-sent by `ReportRetry` until the controller takes it or its deadline
passes. Kinds differ only by the data of `KINDS` (which answers end a report at once, whether the first
answer settles it, whether it waits its turn behind the node's earlier reports, how long it may take), so
there is one policy to read, and the table in docs/client.md is generated from the same rows
(`python -m taskd.agent.link.report_policy --write docs/client.md`). Pure: no clock, no I/O, no grpc.

The blocking re-sends of `taskd.client.retry.ReportRetryPolicy` are for TaskD-API callers only (the
`DLRecoverManager` methods and taskd.api); the agent never uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from taskd.client.retry import MIN_CALL_TIMEOUT, REINIT_CODES, AnswerKind, Decision, classify, meaning
from taskd.doc_block import DocBlock
from taskd.vocabulary import Code

ATTEMPT_TIMEOUT = 5.0  # one attempt's RPC deadline, however far off the report's own deadline is
FIRST_DELAY = 0.1  # seconds before the first re-send, doubled after each answer that is not 0 ...
MAX_DELAY = 2.0  # ... up to this: a restarted controller answers within seconds, do not sleep through its return


class Until(Enum):
    """A report's deadline, counted from when it was made."""

    CONTROLLER = "the controller timeout"  # --controller-timeout: past it the controller counts as gone
    CALL = "its one call's deadline"  # min(5 s, the report's own interval): the next one replaces it


@dataclass(frozen=True)
class ReportKind:
    """What one kind of report is and how it differs from the others (the retry policy is the same for all)."""

    what: str  # how the log lines name it
    method: str  # the RPC
    made: str  # what makes the agent send it (docs/client.md)
    final: frozenset[int] = frozenset({Code.FENCED})  # answers that end it as not taken: a re-send cannot help
    lossy: bool = False  # informational: the first answer other than "busy" settles it (a refusal is logged)
    in_order: bool = True  # waits its turn behind the node's earlier reports (False: sent beside them)
    resend: bool = True  # False: one attempt, whatever it is answered
    until: Until = Until.CONTROLLER
    min_budget: float = 0.0  # seconds: never less time than this, however short the controller timeout
    withdrawn: str = ""  # what makes a pending one moot (docs/client.md)

    def budget(self, controller_timeout: float, call: float = ATTEMPT_TIMEOUT) -> float:
        """Seconds from its making to its deadline."""
        span = controller_timeout if self.until is Until.CONTROLLER else min(ATTEMPT_TIMEOUT, call)
        return max(self.min_budget, span)

    def settles(self, code: int | None, error: str = "") -> bool:
        """Whether an answer that is not a plain "taken" ends the report (`code` None: no answer, `error` why)."""
        if code is not None and code in self.final:
            return True
        if not self.resend:
            return True
        return self.lossy and ((code is not None and classify(code) is not AnswerKind.BUSY) or "UNIMPLEMENTED" in error)


FAULT = ReportKind("fault report", "ReportProcessFault", "a rank died or hung (a later fault joins the pending report)")
STOP_COMPLETE = ReportKind("stop complete", "ReportStopComplete", "every rank stopped for the controller's stopTrain")
STRATEGIES = ReportKind("strategies", "ReportRecoverStrategy", "the strategies this node offers for a round",
                        withdrawn="a new stopTrain")
STATUS = ReportKind("recover status", "ReportRecoverStatus", "a strategy's outcome on this node",
                    withdrawn="a new stopTrain")
RESUMED = ReportKind("training resumed", "ReportResumed", "this node's ranks train again after a round", lossy=True)
RESTARTS = ReportKind("restart count", "Register", "a restart counted here without a controller (degraded)")
FINISH = ReportKind("finish report", "ReportFinished", "every rank of this node ended (after the reports above)",
                    final=frozenset({Code.FENCED, Code.INVALID_PARAMS}), min_budget=1.0)
PACE = ReportKind("pace report", "ReportPace", "every --straggler-interval, the ranks' compute time per step",
                  lossy=True, in_order=False, resend=False, until=Until.CALL)
MIGRATION = ReportKind("migration report", "ReportMigration",
                       "a planned migration of a rank of this node ended (`taskd migrate`): done, or why not",
                       lossy=True)
KINDS = (FAULT, STOP_COMPLETE, STRATEGIES, STATUS, RESUMED, RESTARTS, FINISH, PACE, MIGRATION)


def check_kinds(kinds: tuple[ReportKind, ...]) -> None:
    """The table's own rules (run at import): one row per name and per RPC, every kind ends at a fence, one that is
    never re-sent only informs."""
    for attr in ("what", "method"):
        names = [getattr(k, attr) for k in kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"report kinds: a {attr} given twice in {names}")
    for kind in kinds:
        if Code.FENCED not in kind.final:
            raise ValueError(f"report kind {kind.what!r}: a fenced agent's report (411) must end it")
        if not kind.resend and not kind.lossy:
            raise ValueError(f"report kind {kind.what!r}: a report sent once must be lossy (nothing waits on it)")


check_kinds(KINDS)


@dataclass
class ReportRetry:
    """When to send a report again, and why: at once, then FIRST_DELAY doubling to MAX_DELAY after each answer that
    is not 0, until the deadline (a fault report not taken by then means degraded mode).

    Every refusal is re-sent until the deadline (unless its kind says it settles it), since only the deadline
    decides that the controller is gone. An "unknown agent/job" answer re-registers (re-Inits) before the re-send;
    any other refusal re-registers before its first re-send only (the controller may have lost this agent's
    registration another way)."""

    deadline: float
    delay: float = FIRST_DELAY
    max_delay: float = MAX_DELAY
    next_at: float | None = None  # None: send now
    attempts: int = 0
    reregistered: bool = False

    def due(self, now: float) -> bool:
        return not self.expired(now) and (self.next_at is None or now >= self.next_at)

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def attempt_timeout(self, now: float) -> float:
        """The deadline of an attempt sent at `now`: never past the report's own."""
        return max(MIN_CALL_TIMEOUT, min(ATTEMPT_TIMEOUT, self.deadline - now))

    def sent(self) -> None:
        self.attempts += 1

    def answered(self, code: int | None, now: float, error: str = "") -> Decision:
        """After an attempt: `code` the controller's answer, None when it did not answer (`error` says why).
        A re-send is scheduled (never later than the deadline, where `expired` takes over) unless it was taken."""
        if code == Code.OK:
            return Decision(False, why="accepted")
        reinit = reregister = False
        if code is None:
            why = error or "no answer"
        else:
            why = meaning(code)
            kind = classify(code)
            reinit = code in REINIT_CODES
            reregister = kind is AnswerKind.UNKNOWN_AGENT or (kind is not AnswerKind.BUSY and not self.reregistered)
            self.reregistered = self.reregistered or reregister
        delay = self.delay
        self.next_at = min(now + delay, self.deadline)
        self.delay = min(self.delay * 2, self.max_delay)
        return Decision(True, delay=delay, reinit=reinit, reregister=reregister, why=why)


# ---------------------------------------------------------------------------- the table in docs/client.md

def _codes(kind: ReportKind) -> str:
    return ", ".join(str(int(c)) for c in sorted(kind.final))


def describe_kinds(kinds: tuple[ReportKind, ...] = KINDS) -> str:
    """The Markdown table of what the agent re-sends, how often, until when."""
    rows = ["| report (RPC) | sent when | order | re-sent | ends at once on | until |",
            "| --- | --- | --- | --- | --- | --- |"]
    for k in kinds:
        order = "in turn, behind the node's earlier reports" if k.in_order else "beside the queue, never waits"
        pause = f"{FIRST_DELAY:g} s doubling to {MAX_DELAY:g} s"
        if not k.resend:
            resend = "never: one attempt"
        elif k.lossy:
            resend = f"while unanswered or busy, after {pause}; its first other answer settles it"
        else:
            resend = f"after each answer that is not 0, or none, after {pause}"
        until = k.until.value + (f" (at least {k.min_budget:g} s)" if k.min_budget else "")
        if k.withdrawn:
            until += f", or {k.withdrawn}"
        rows.append(f"| {k.what} (`{k.method}`) | {k.made} | {order} | {resend} | {_codes(k)} | {until} |")
    return "\n".join(rows)


DOC = DocBlock("agent-reports", "taskd.agent.link.report_policy", "docs/client.md", "the agent's report table",
               describe_kinds, description=__doc__.splitlines()[0])
main = DOC.main

__all__ = ["ATTEMPT_TIMEOUT", "FAULT", "FINISH", "KINDS", "MIGRATION", "PACE", "RESTARTS", "RESUMED", "STATUS",
           "STOP_COMPLETE", "STRATEGIES", "ReportKind", "ReportRetry", "Until", "check_kinds", "describe_kinds", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
