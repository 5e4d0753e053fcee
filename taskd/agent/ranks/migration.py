"""A planned migration on the agent (`taskd migrate`; docs/worker.md, "Planned migration"): one rank of this node
moves to a warm spare at a step boundary while the job trains on.

The phases, each bounded, polled from the supervisor's loop (agent thread only):

1. **prepare**: a warm spare is bound as the rank's successor (`Launcher.prepare_successor`); it runs the
   script into `LiveGroup()` and waits there. Nothing of the job changes until it is ready, so a missing spare,
   a successor that dies or never gets ready leaves the job as it was.
2. **migrate**: the control file names generation g with action ``migrate`` and the leaving rank; the ranks
   agree on a step boundary (taskd.worker.migration), the staying ranks and the successor form g (a survivor
   hands the successor the replicated state), the leaving rank leaves and waits.
3. **adopt**: every rank has joined g: the successor becomes the rank's process (`adopt_successor`), and the
   leaving rank is released (``release`` of g) and exits 0. If the successor ends before that, or g does not
   form in time, the migration is called off: generation g+1 is named with the old rank in it.

The decision of whether to start at all is `refusal` (pure).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from taskd.agent.link.controller import ControllerLink
from taskd.agent.ranks.launcher import Launcher
from taskd.agent.ranks.live import RANK_TIMEOUT, LiveRanks
from taskd.agent.ranks.table import Rank, RankState, RankTable
from taskd.worker.live import Phase, RankStatus, read_rank_status, write_control

log = logging.getLogger("taskd.agent")

READY_TIMEOUT = 120.0  # the successor's script up to LiveGroup(): imports (a warm spare has torch), model, optimizer
FORM_TIMEOUT = RANK_TIMEOUT + 30.0  # the ranks reach the boundary (a step or two) and form the generation


@dataclass(frozen=True)
class Outcome:
    """How a migration ended, as the controller records it (taskd.v1 `MigrationReport`)."""

    migration: str
    rank: int
    migrated: bool
    reason: str = ""
    old_pid: int = 0
    new_pid: int = 0
    step: int = 0
    pause_seconds: float = 0.0
    resumed_seconds: float = 0.0
    generation: int = 0


def refusal(rank: int, local: Rank | None, live_enabled: bool, can_rejoin: bool, busy: str) -> str:
    """Why this node cannot start moving global ``rank`` now ("" when it can); pure."""
    if local is None:
        return f"rank {rank} does not run on this node"
    if not live_enabled:
        return "the job has no live recovery (its script does not use LiveGroup, or TASKD_RDZV_STORE=rank)"
    if busy:
        return busy
    if local.state is not RankState.RUNNING:
        return f"rank {rank} is {local.state.value}, not running"
    if not can_rejoin:
        return ("not every rank of the node declared it can rejoin in place (LiveGroup; not pure FSDP2 without "
                "snapshots, where no peer holds a rank's shards)")
    return ""


def migration_generation(asked: int, newest: int) -> int:
    """The generation a migration names: the controller's if it is above this node's newest, else the next of this
    node's own. A called-off migration names one the controller never hears of (`_call_off`), after which every
    later migration of the job was refused; one-node jobs only, as `LiveRanks.next_generation` for recoveries."""
    return asked if asked > newest else newest + 1


def pause_seconds(left: dict[int, float], joined: dict[int, float]) -> float:
    """How long no rank trained: from the first rank's end of its last step before the boundary (``left``) to the
    last rank's state synced in the new generation (``joined``); pure."""
    if not left or not joined:
        return 0.0
    return max(0.0, max(joined.values()) - min(left.values()))


@dataclass
class Migration:
    """One migration in progress."""

    migration: str
    rank: Rank
    generation: int
    path: str  # the successor's heartbeat file until it is adopted
    deadline: float
    old_pid: int
    phase: str = "prepare"  # prepare -> migrate -> adopted
    beats: dict[int, dict[int, float]] = field(default_factory=dict)  # global rank -> {step: heartbeat time}
    new_pid: int = 0
    joined: dict[int, float] = field(default_factory=dict)


def keep_beats(ranks: list[Rank], live: LiveRanks, generation: int, beats: dict[int, dict[int, float]]) -> None:
    """Keep each rank's recent (step, heartbeat time) while it is still in the generation before ``generation``:
    the end of its last step before the boundary, which a migration's pause is measured from."""
    for rank in ranks:
        status = live.status(rank)
        if status is not None and status.heartbeat.step is not None and status.generation != generation:
            steps = beats.setdefault(rank.global_rank, {})
            steps[status.heartbeat.step] = status.heartbeat.time
            for old in sorted(steps)[:-4]:
                del steps[old]


class Migrations:
    """This node's migration, driven from the supervisor's loop; `report` tells the controller how it ended."""

    def __init__(self, table: RankTable, live: LiveRanks, details: Launcher, take_over: Callable[[Rank], bool],
                 report: Callable[[Outcome], None]) -> None:
        self.table = table
        self.live = live
        self.details = details
        self.take_over = take_over
        self.report = report
        self.active: Migration | None = None

    def start(self, migration: str, rank: int | None, generation: int | None, now: float) -> None:
        """The controller's `taskd.migrate`: refused at once (reported), or its successor prepared."""
        local = next((r for r in self.table.all() if r.global_rank == rank), None)
        if rank is None or generation is None:
            return self._end(Outcome(migration, rank or 0, False, "the migrate signal named no rank or generation"))
        busy = "a migration is already in progress on this node" if self.active is not None else \
            "a recovery is in progress on this node" if self.live.rebuild is not None else ""
        why = refusal(rank, local, self.live.enabled, self.live.can("rejoin"), busy)
        generation = migration_generation(generation, self.live.generation)
        if why:
            return self._end(Outcome(migration, rank, False, why, generation=generation))
        assert local is not None and local.pid is not None
        prepared = self.details.prepare_successor(local.local_rank, generation - 1)
        if prepared is None:
            return self._end(Outcome(migration, rank, False, "no warm spare is ready on this node to take the rank "
                                     "(taskd run --warm-spares N; a spare used by a recovery is refilled 5 s later)",
                                     generation=generation))
        path, pid = prepared
        self.active = Migration(migration, local, generation, path, now + READY_TIMEOUT, local.pid, new_pid=pid)
        log.info("migration of rank %d (pid %d): successor pid %d starting from a warm spare", rank, local.pid, pid)

    def start_local(self, migration: str, rank: int, now: float) -> bool:
        """A migration this agent decided itself (`--migrate-stragglers`), of the node's next generation: whether it
        started (else it was refused and reported, with its reason)."""
        self.start(migration, rank, 0, now)
        return self.active is not None and self.active.migration == migration

    def poll(self, now: float) -> None:
        m = self.active
        if m is None:
            return
        if self.live.rebuild is not None or any(not r.state.alive for r in self.table.all() if r is not m.rank):
            return self._call_off(m, "a fault on this node: its recovery takes over")
        if m.phase == "prepare":
            self._prepare(m, now)
        elif m.phase == "migrate":
            self._migrate(m, now)

    def _successor(self, m: Migration) -> RankStatus | None:
        try:
            status = read_rank_status(m.path)
        except (OSError, ValueError):
            return None
        if status.heartbeat.pid:
            m.new_pid = status.heartbeat.pid
        return status

    def _successor_gone(self, m: Migration) -> bool:
        """Whether the successor's process ended (a zombie too: a bound spare is reaped only when discarded)."""
        if not m.new_pid:
            return False
        try:
            return psutil.Process(m.new_pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def _prepare(self, m: Migration, now: float) -> None:
        status = self._successor(m)
        self._beats(m)
        if self._successor_gone(m):
            return self._call_off(m, f"the successor (pid {m.new_pid}) ended before it was ready")
        if status is not None and status.declared and status.can_rejoin and status.phase is Phase.REJOINING:
            self.live.next_generation(m.generation)
            write_control(self.live.control_path, m.generation, "migrate", timeout=RANK_TIMEOUT,  # type: ignore[arg-type]
                          leaving=[m.rank.global_rank])
            self.details.set_generation(m.generation)
            m.phase, m.deadline = "migrate", now + FORM_TIMEOUT
            log.info("migration of rank %d: successor pid %d ready; the ranks leave generation %d at their next "
                     "step boundary", m.rank.global_rank, m.new_pid, m.generation - 1)
        elif now >= m.deadline:
            self._call_off(m, f"the successor was not ready within {READY_TIMEOUT:.0f}s")

    def _beats(self, m: Migration) -> None:
        keep_beats(self.table.all(), self.live, m.generation, m.beats)

    def _migrate(self, m: Migration, now: float) -> None:
        self._beats(m)
        successor = self._successor(m)
        if self._successor_gone(m) or (successor is not None and successor.phase is Phase.GAVE_UP):
            return self._call_off(m, f"the successor (pid {m.new_pid}) ended before the group re-formed")
        staying = {r.global_rank: self.live.status(r) for r in self.table.all() if r is not m.rank}
        if successor is None or not successor.rejoined(m.generation) or \
                not all(s is not None and s.rejoined(m.generation) for s in staying.values()):
            if now >= m.deadline:
                self._call_off(m, f"generation {m.generation} did not form within {FORM_TIMEOUT:.0f}s")
            return
        step = successor.resume_step or 0
        joined = {r: s.joined_time or 0.0 for r, s in staying.items() if s is not None}
        joined[m.rank.global_rank] = successor.joined_time or 0.0
        left = {r: beats[step - 1] for r, beats in m.beats.items() if step - 1 in beats}
        self.details.adopt_successor(m.rank.local_rank)
        self.live.forget(m.rank.local_rank)
        self.take_over(m.rank)
        write_control(self.live.control_path, m.generation, "release", timeout=RANK_TIMEOUT)  # type: ignore[arg-type]
        self.active = None
        pause = pause_seconds(left, joined)
        log.info("migrated rank %d (pid %d -> %d) at step %d: training paused %.3fs (from the first rank's end of "
                 "step %d to the last rank's state synced in generation %d)", m.rank.global_rank, m.old_pid,
                 m.rank.pid or m.new_pid, step, pause, step - 1, m.generation)
        self._end(Outcome(m.migration, m.rank.global_rank, True, old_pid=m.old_pid, new_pid=m.rank.pid or m.new_pid,
                          step=step, pause_seconds=pause, generation=m.generation))

    def _call_off(self, m: Migration, why: str) -> None:
        """The job goes on as it was: the successor is discarded and, once the ranks were told to migrate, a newer
        generation is named with the old rank in it (it waits, paused, for exactly that)."""
        self.active = None
        self.details.discard_successor(m.rank.local_rank)
        if m.phase == "migrate" and self.live.rebuild is None:
            generation = self.live.next_generation()
            write_control(self.live.control_path, generation, "rejoin", timeout=RANK_TIMEOUT)  # type: ignore[arg-type]
            self.details.set_generation(generation)
        self._end(Outcome(m.migration, m.rank.global_rank, False, f"called off: {why}; the job runs as it was",
                          generation=m.generation))

    def _end(self, outcome: Outcome) -> None:
        if not outcome.migrated and outcome.reason and self.active is None:
            log.warning("migration of rank %d not done: %s", outcome.rank, outcome.reason)
        self.report(outcome)


def report_migration(link: ControllerLink, outcome: Outcome) -> bool:
    """Tell the controller how the migration ended (taskd.v1 `ReportMigration`, through the node's reports);
    False without a controller to tell."""
    return link.reports.migration(
        migration=outcome.migration, migrated=outcome.migrated, reason=outcome.reason, rank=outcome.rank,
        oldPid=outcome.old_pid, newPid=outcome.new_pid, step=outcome.step, pauseSeconds=outcome.pause_seconds,
        resumedSeconds=outcome.resumed_seconds, generation=outcome.generation)


__all__ = ["FORM_TIMEOUT", "READY_TIMEOUT", "Migration", "Migrations", "Outcome", "keep_beats",
           "migration_generation", "pause_seconds", "refusal", "report_migration"]
