"""Which recovery strategy a round takes: the whole policy, as one function read top to bottom.

Pure: it reads the round (faults, what each agent reported, what failed or was excluded) and the
job's policy and budget, and changes nothing. docs/controller.md ("The decision") says the same in prose.
"""

from __future__ import annotations

from typing import Protocol

from taskd.controller.machine.model import Round
from taskd.vocabulary import FaultType, Strategy

RESTARTING = frozenset({Strategy.RECOVER, Strategy.JOB_RESCHEDULING})
"""Strategies that restart processes and so spend the restart budget."""

IN_PLACE = frozenset({Strategy.RETRY, Strategy.RECOVER})
"""Strategies that keep healthy ranks alive; excluded when the round lost track of an agent."""


class JobPolicy(Protocol):
    """What the decision reads of the job (a `Job` is one)."""

    policy: tuple[str, ...]  # strategies the job allows; empty = all
    restarts: int
    max_restarts: int
    recover_banned: bool


def charged(strategy: str, r: Round | None) -> bool:
    """The round already paid a restart, so `strategy` costs none: a round charges one restart in all.

    A recover that fails and escalates to job-rescheduling is one restart, not two; a round re-run from
    stopTrain after a controller restart (RECOVERING -> RESUMING) must not pay again either; and a round
    opened because a recover did not settle counts that recover (`Job.open_round` puts it in `tried`)."""
    return r is not None and strategy in RESTARTING and any(s in RESTARTING for s in r.tried)


def unsettled(since: float, window: float, restarted_rank: bool, rejoined: bool) -> str:
    """Why a fault `since` seconds after a successful recover is that recover failing ("" = it is a new fault).

    The settle rule (README, docs/controller.md): within the settle window, a fault of a rank the recover
    restarted counts; so does a fault of any other rank unless every agent reported that its ranks re-formed
    their group with the restarted ones (`rejoined`: taskd's live recovery). Without that confirmation the
    survivors only had their peers replaced under them, and a tightly coupled survivor breaks soon after
    (MindSpore under msrun: 0.4 s); with it the group is whole again, and a survivor's fault is a new one,
    recovered in place like the first."""
    if since > window or not (restarted_rank or not rejoined):
        return ""
    what = ("a rank it restarted failed again" if restarted_rank else
            "its ranks were restarted without re-forming the group, and a survivor failed")
    return f"recover {since:.1f}s ago did not settle ({what})"


def why_not(strategy: str, job: JobPolicy, r: Round | None) -> str:
    """Why `strategy` cannot be chosen now ("" = it can). `exit` always can."""
    if strategy == Strategy.EXIT:
        return ""
    if r is not None:
        if strategy in r.failed:
            return "failed this round"
        if strategy in r.excluded:
            return r.excluded[strategy]
    if job.policy and strategy not in job.policy:
        return "not allowed by the job's policy"
    types = set(r.faults.values()) if r else set()
    if strategy == Strategy.RETRY and types != {FaultType.RECOVERABLE}:
        return f"fault types {sorted(types)} are not all recoverable in place"
    if strategy == Strategy.RECOVER and types - {FaultType.RECOVERABLE, FaultType.PROCESS}:
        return "network fault needs more than restarting the faulty ranks"
    if strategy == Strategy.RECOVER and job.recover_banned:
        return "recover failed to settle twice in this job"
    if strategy in RESTARTING and job.restarts >= job.max_restarts and not charged(strategy, r):
        return f"restart budget spent ({job.restarts}/{job.max_restarts})"
    if r is not None:
        lacking = sorted(n for n in r.participants if strategy not in r.reports.get(n, ()))
        if lacking:
            return f"not supported by node(s) {lacking}"
    return ""


def choose_strategy(job: JobPolicy, r: Round) -> tuple[str, dict[str, str]]:
    """The round's strategy, and why each one preferred to it was skipped.

    The first of `Strategy.ORDER` (retry, recover, job-rescheduling, dump, exit) that `why_not` allows;
    `exit` when no agent of the round answered."""
    if not r.participants:
        return Strategy.EXIT, {"*": "no agent of the job answered"}
    skipped: dict[str, str] = {}
    for strategy in Strategy.ORDER:
        why = why_not(strategy, job, r)
        if not why:
            return strategy, skipped
        skipped[strategy] = why
    return Strategy.EXIT, skipped  # not reached: exit is always allowed
