"""`--migrate-stragglers` (issue 34, item 4): a rank judged a straggler for a sustained window moves to a warm spare.

The judge (taskd/pace.py, through agent/watches/stragglers.py) says when a rank becomes a straggler and when it is
one no more. This module decides what to do about it, on every sweep; the move itself is a planned migration of
the rank (agent/ranks/migration.py: a warm spare bound as its successor, the ranks re-form at one step boundary,
the state handed over in memory, 0 steps redone). Why a straggler moves: a slow device, a noisy neighbour or a
throttled host slows the process, not the rank's work, so a fresh process from a spare runs at its peers' pace.

The decision is a rule table (`RULES`, first match wins) over `Facts`. A *window* is four pace report intervals
(4 x `--straggler-interval`), and no less than the judge's pace window of 10 steps takes to forget a stall of the
host. A rank is a *sustained* straggler when the judge named it (its verdict, not cleared since) and, at every pace
report for a whole window, its compute seconds per step were at least F x the median of its peers' (a streak,
`StragglerMoves.standing`): the judge's hysteresis keeps a verdict standing down to 0.8 F, and a stall of the shared
host lands in whichever rank was computing when it struck, so one report over F, or a rank that drifts between 0.8 F
and F, is not enough (on a loaded 2-core host a 2-rank job with no slow rank and ms of compute a step read 3-22x for
one report at a time: tests/unit/agent/watches/test_straggler_moves.py replays such a recording). A node moves at
most one straggler per window; a rank whose move was refused (no spare ready, a recovery under way) is tried again
a window later, never sooner. Every attempt is one job event: `migrated`, or `migration_failed` with its reason
(the controller counts both in `taskd_migrations{trigger="straggler"}`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from taskd.agent.config import AgentConfig
from taskd.agent.ranks.migration import Migrations
from taskd.agent.ranks.table import RankTable
from taskd.pace import WINDOW, RankPace, Verdict, peer_medians
from taskd.vocabulary import STRAGGLER_MIGRATION

log = logging.getLogger("taskd.agent")

WINDOW_REPORTS = 4  # pace report intervals in a window: five reports in a row
MOVE, WAIT = "move", "wait"


@dataclass(frozen=True)
class Facts:
    """What the decision about one straggler depends on, read on one sweep."""

    sustained: bool  # judged a straggler, and F x its peers' median at every pace report for a whole window
    moved_recently: bool  # this node moved (or tried to move) a straggler less than a window ago
    tried_recently: bool  # this rank's last attempt was less than a window ago
    running: bool  # the node's round machine is RUNNING (no round, no recovery)
    one_node: bool  # the job runs on one node (a migration re-forms one node's group only, as `taskd migrate`'s)
    busy: bool  # a migration is in progress on this node


@dataclass(frozen=True)
class Rule:
    when: Callable[[Facts], bool]
    decision: str
    why: str


RULES: tuple[Rule, ...] = (
    Rule(lambda f: not f.sustained, WAIT, "not F x its peers' median at every report for a whole window yet"),
    Rule(lambda f: f.busy, WAIT, "a migration is in progress on this node"),
    Rule(lambda f: f.moved_recently, WAIT, "this node moved a straggler less than a window ago"),
    Rule(lambda f: f.tried_recently, WAIT, "this rank's last move was tried less than a window ago"),
    Rule(lambda f: not f.running, WAIT, "a recovery is under way on this node"),
    Rule(lambda f: not f.one_node, WAIT, "the job runs on more than one node: planned migration is one-node so far"),
    Rule(lambda f: True, MOVE, "a straggler for a whole window"),
)


def straggler_moves(config: AgentConfig, table: RankTable, migrations: Migrations, state: Callable[[], str]
                    ) -> StragglerMoves | None:
    """The agent's mover (None without `--migrate-stragglers`): ``state`` its round machine's state."""
    if not config.migrate_stragglers or config.straggler_factor is None:
        return None
    return StragglerMoves(config.straggler_factor, config.straggler_interval,
                          lambda: {r.global_rank for r in table.all()},
                          migrations.start_local, lambda: state() == "RUNNING",
                          lambda: migrations.active is not None, lambda: table.layout.node_count == 1)


def decide(facts: Facts) -> Rule:
    """The first rule that matches ``facts``; pure."""
    return next(rule for rule in RULES if rule.when(facts))


class StragglerMoves:
    """Which of this node's ranks are stragglers since when, and the moves tried; driven from the agent's sweep.

    ``start(migration, rank, now)`` starts a planned migration (`Migrations.start` with the node's next generation)
    and returns whether it started (a refusal is reported by it, with its reason, as a `migration_failed` event);
    ``running()`` whether the node's round machine is RUNNING; ``busy()`` whether a migration is in progress."""

    def __init__(self, factor: float, interval: float, local: Callable[[], set[int]],
                 start: Callable[[str, int, float], bool], running: Callable[[], bool], busy: Callable[[], bool],
                 one_node: Callable[[], bool]) -> None:
        self.factor = factor
        self.window = WINDOW_REPORTS * interval
        self.local = local
        self.start = start
        self.running = running
        self.busy = busy
        self.one_node = one_node
        self.since: dict[int, tuple[float, Verdict]] = {}  # a straggler now: since when, its last verdict
        self.streak: dict[int, tuple[float, float]] = {}  # rank -> (first, last) report of its run at F x the median
        self.tried: dict[int, float] = {}  # rank -> its last attempt
        self.last_move: float | None = None

    def observe(self, verdicts: Iterable[Verdict], now: float) -> None:
        """Take the judge's new verdicts about this node's ranks: a straggler since now, or one no more."""
        mine = self.local()
        for v in verdicts:
            if v.rank not in mine:
                continue
            if v.cleared:
                self.since.pop(v.rank, None)
            else:
                first = self.since.get(v.rank, (now, v))[0]
                self.since[v.rank] = (first, v)

    def standing(self, paces: Iterable[RankPace], now: float) -> None:
        """One pace report's figures for this node's ranks (a one-node job: the whole job): a rank F x the median of
        its peers' starts or extends its streak; any other (under F, or no figure: restarted, too new) ends it."""
        paces = list(paces)
        over = {p.rank for p, median in zip(paces, peer_medians([p.seconds for p in paces]), strict=True)
                if median > 0 and p.seconds >= self.factor * median}
        self.streak = {rank: (self.streak.get(rank, (now, now))[0], now) for rank in over}

    def act(self, verdicts: Iterable[Verdict], now: float) -> list[str]:
        """One sweep: the new verdicts, then at most one move; the migration ids started (for tests and logs)."""
        self.observe(verdicts, now)
        started = []
        mine = self.local()
        for rank, (since, verdict) in sorted(self.since.items(), key=lambda item: item[1][0]):
            if rank not in mine:
                del self.since[rank]
                continue
            rule = decide(self.facts(rank, now))
            if rule.decision != MOVE:
                continue
            migration = f"{STRAGGLER_MIGRATION}{uuid.uuid4().hex[:12]}"  # the trigger, for the events
            self.tried[rank] = self.last_move = now
            first, last = self.streak[rank]
            log.warning("--migrate-stragglers: rank %d has been a straggler for %.1fs (%.2fx the median of its peers, "
                        "at least %gx at every pace report for %.1fs): moving it to a warm spare (migration %s)", rank,
                        now - since, verdict.ratio, self.factor, last - first, migration)
            if self.start(migration, rank, now):
                del self.since[rank]  # its successor is judged afresh (a new process, a new pace window)
                self.streak.pop(rank, None)
                started.append(migration)
            break  # one decision a sweep
        return started

    def facts(self, rank: int, now: float) -> Facts:
        tried = self.tried.get(rank)
        verdict = self.since[rank][1]
        first, last = self.streak.get(rank, (now, now - 1))
        # measured to the last report that found it F x the median, not to now: the next may find it under. A stall
        # of the shared host stays in the judge's pace window for WINDOW steps (each at least the straggler's
        # compute seconds long): the streak must outlast it too
        return Facts(sustained=last - first >= max(self.window, WINDOW * verdict.seconds),
                     moved_recently=self.last_move is not None and now - self.last_move < self.window,
                     tried_recently=tried is not None and now - tried < self.window,
                     running=self.running(), busy=self.busy(), one_node=self.one_node())


__all__ = ["Facts", "MOVE", "RULES", "Rule", "StragglerMoves", "WAIT", "WINDOW_REPORTS", "decide",
           "straggler_moves"]
