"""The agent's side of live recovery (docs/worker.md, "Live recovery protocol"): read what ranks
declare and report in their heartbeat files, write the node's control file, and confirm that a
recovery really happened before telling the controller so.

The launcher says whether a job has live recovery (it hosts the store and gives ranks a control
file: ``details.control_path()``); the agent only reads that, through the declared launcher
interface (agent/ranks/launcher.py), so it needs neither torch nor the launcher package. Everything
here runs on the agent's thread; the supervisor calls :meth:`LiveRanks.poll` every ``POLL`` seconds
while live recovery is on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from taskd.agent.ranks import resize
from taskd.agent.ranks.launcher import Launcher
from taskd.agent.ranks.table import Rank, RankState, RankTable
from taskd.agent.round.events import GroupFailed, GroupRejoined, Resumed
from taskd.vocabulary import FaultRanks, FaultType, Strategy
from taskd.worker.heartbeat_file import HeartbeatFile, HeartbeatFileError
from taskd.worker.live import (
    SHARDS_LOST_EXIT,
    STUCK_EXIT,
    ErrorKind,
    Phase,
    RankStatus,
    read_rank_status,
    write_control,
)

log = logging.getLogger("taskd.agent")

POLL = 0.05  # seconds between reads of the heartbeat files while live recovery is on (~3 us a rank)
IDLE_POLL = 0.25  # the same between rounds: the ranks ring the agent's doorbell when they write what it must act on
REJOIN_TIMEOUT = 120.0  # the longest a group may take to re-form, if the controller's deadline is longer
RANK_TIMEOUT = 60.0  # how long ranks may spend forming one generation (the control file's "timeout")


@dataclass
class Rebuild:
    """A recovery carried out on this node and not yet confirmed by the ranks (rejoined, then resumed)."""

    generation: int
    strategy: str
    faults: FaultRanks
    started: float  # monotonic time of the fault (the round's start)
    deadline: float  # monotonic: not rejoined by then = the recovery failed
    steps_before: dict[int, int | None] = field(default_factory=dict)  # local rank -> steps completed at the fault
    confirmed: float | None = None  # monotonic time every local rank had rejoined
    report: bool = True  # the controller waits for this node's status (recover, retry)


class LiveRanks:
    """Declarations, in-place errors and group generations of one node's ranks."""

    def __init__(self, table: RankTable, details: Launcher) -> None:
        self.table = table
        self.details = details
        # the launcher expects its ranks to declare what they can do in place (taskd run, a .py entrypoint),
        # whether or not it hosts a store for them: recover is then offered only to ranks that declared it
        self.declarations = bool(details.rank_declarations)
        self.generation = 0  # the newest generation this node has named
        self.rebuild: Rebuild | None = None
        self._files: dict[int, HeartbeatFile] = {}
        self._declared: dict[int, tuple[bool, bool, bool]] = {}  # local rank -> (rejoin, retry, resize), last declared
        self._resize: resize.Resize | None = None  # the group's size and rank map since a downgrade or upgrade
        self._errors: dict[tuple[int, int], int] = {}  # (local rank, pid) -> in-place errors already seen
        # local rank -> (pid, generation) whose collective timed out waiting, in that generation (stalled())
        self._timed_out: dict[int, tuple[int, int | None]] = {}
        self._steps: dict[int, int | None] = {}  # local rank -> last completed step seen (before a fault)
        self._group: set[int] = set()  # local ranks seen in a group generation (the rest are independent)
        self._left: int | None = None  # the generation this node last told its ranks to leave

    @property
    def control_path(self) -> str | None:
        """Asked each time, not kept: a standby's launcher has no live store until it is given a node rank
        (a kept None made a standby's ranks start into generation 0 while the survivors waited in g)."""
        return self.details.control_path() if self.details.live_recovery else None

    @property
    def enabled(self) -> bool:
        return self.control_path is not None

    # -- reading the ranks ---------------------------------------------------------------------
    def status(self, rank: Rank) -> RankStatus | None:
        """The rank's heartbeat and live fields, None without a readable file of its current incarnation."""
        path = self.details.heartbeat_path(rank.local_rank)
        if not path:
            return None
        hb = self._files.get(rank.local_rank)
        if hb is None or hb.path != str(path):
            hb = HeartbeatFile(path)
            self._files[rank.local_rank] = hb
        try:
            status = read_rank_status(hb)
        except (HeartbeatFileError, OSError, ValueError):
            return None
        if status.heartbeat.pid != rank.pid:
            return None
        if status.declared:  # kept when the rank dies or a replacement has not declared yet
            self._declared[rank.local_rank] = (status.can_rejoin, status.can_retry, status.can_resize)
        if status.generation is not None or status.phase is Phase.REJOINING:  # joined, or forming, a group
            self._group.add(rank.local_rank)
        return status

    def refused(self, rank: Rank) -> bool:
        """Whether ``rank`` exited refusing live recovery cleanly: `SHARDS_LOST_EXIT` after it said GAVE_UP (its
        shards are lost; a script's own exit 76 says no GAVE_UP). The round acts on it as on a fault; it is none."""
        if rank.returncode != SHARDS_LOST_EXIT:
            return False
        status = self.status(rank)
        return status is not None and status.phase is Phase.GAVE_UP

    def stuck(self, rank: Rank) -> bool:
        """Whether ``rank`` ended itself left blocked in its broken group (`STUCK_EXIT`) while this node rebuilds
        that group: a survivor, started again into the new generation (agent/round/handlers.py)."""
        return self.enabled and self.rebuild is not None and rank.returncode == STUCK_EXIT

    def forget(self, local_rank: int) -> None:
        """Drop the rank's cached mapping: its heartbeat file was replaced by another (a migration's successor's)."""
        hb = self._files.pop(local_rank, None)
        if hb is not None:
            hb.close()

    def grouped(self, rank: Rank) -> bool:
        """Whether the rank was seen in a group generation (the rest are independent ranks)."""
        return rank.local_rank in self._group

    def refresh(self) -> dict[int, RankStatus]:
        statuses = {}
        for rank in self.table.all():
            status = self.status(rank) if rank.pid is not None else None
            if status is not None:
                statuses[rank.local_rank] = status
                if self.rebuild is None and status.heartbeat.step is not None:
                    self._steps[rank.local_rank] = status.heartbeat.step
        return statuses

    def can(self, what: str) -> bool:
        """Whether every local rank has declared it can ``rejoin`` (recover in place), ``retry`` or ``resize``."""
        self.refresh()
        index = ("rejoin", "retry", "resize").index(what)
        return bool(self.table.all()) and all(self._declared.get(r.local_rank, (False, False, False))[index]
                                              for r in self.table.all())

    def offer(self, configured: list[str], faults: FaultRanks, scales: bool = False) -> list[str]:
        """What this node offers for the round: recover only if every rank declared it can rejoin
        (a script that has not gets job-rescheduling first), retry only for type-"0" faults of ranks that can;
        downgrade and upgrade when the job `scales` and every rank has a resize hook (agent/ranks/resize.py)."""
        offered = [s for s in configured if s != Strategy.RETRY or self.enabled]
        if Strategy.RECOVER in offered and (why := self._recover_refused(faults)):
            offered.remove(Strategy.RECOVER)
            # said only to a job that could have been live: a script that never used LiveGroup (no store was
            # hosted for it, no rank declared anything) was never promised it (issue 32, F10)
            said = self.enabled or any(any(d) for d in self._declared.values())
            log.log(logging.INFO if said else logging.DEBUG, "live recovery: %s", why)
        if Strategy.RETRY in offered and not (faults and set(faults.values()) == {FaultType.RECOVERABLE}
                                              and self.can("retry")):
            offered.remove(Strategy.RETRY)
        # a resize re-forms the group in place as a recover does: only where a recover could
        return resize.offers(offered, scales, self.enabled and self.declarations,
                             scales and Strategy.RECOVER in offered and self.can("resize"))

    def _recover_refused(self, faults: FaultRanks) -> str:
        """Why recover cannot replace ``faults`` in place ("" when it can): what `offer` says, and what keeps
        `prepare` from starting a replacement that could never join."""
        finished = sorted(r.global_rank for r in self.table.in_state(RankState.SUCCEEDED))
        if self.declarations and finished and self.enabled:
            # a rank that finished its last step has left the group for good: a replacement would wait for it
            # to rejoin until the rebuild timed out (issue 21, D3: 150 s), so every rank restarts instead
            return f"rank(s) {finished} already finished and cannot rejoin a rebuilt group: recover not offered"
        if self.declarations and not self.can("rejoin"):
            return "not every rank declared it can rejoin in place: recover not offered"
        if self.enabled and self.store_host_lost(faults):
            return ("node 0, which hosted the job's rendezvous store, is lost: recover not offered "
                    "(job-rescheduling restarts every rank against the store of its replacement)")
        return ""

    def _newest_generation(self) -> int:
        """The newest generation named here or joined by a local rank: the one a fault breaks."""
        return max([self.generation, *(s.generation for s in self.refresh().values() if s.generation is not None)])

    def store_host_lost(self, faults: FaultRanks) -> bool:
        """Whether every rank of node 0 is a fault rank, seen from another node: node 0's agent hosts the store the
        live group re-forms on, so a lost node 0 took it along and the survivors cannot rejoin in place."""
        layout = self.table.layout
        if layout is None or layout.node_count <= 1 or layout.node_rank == 0:
            return False
        return set(range(layout.ranks_per_node)) <= set(faults)

    def new_errors(self) -> list[tuple[Rank, RankStatus]]:
        """Running ranks that reported a new RetryableError (fault type "0"); other in-place errors are
        consequences of a fault the agent sees itself (a dead peer) and are not faults of their own."""
        found = []
        for rank in self.table.in_state(RankState.RUNNING):
            status = self.status(rank)
            if status is None or rank.pid is None:
                continue
            key = (rank.local_rank, rank.pid)
            if status.errors > self._errors.get(key, 0):
                self._errors[key] = status.errors
                if status.error_kind == ErrorKind.RETRYABLE:
                    found.append((rank, status))
                elif status.error_kind == ErrorKind.COLLECTIVE_TIMEOUT and not status.erred_before_joining():
                    self._timed_out[rank.local_rank] = (rank.pid, status.generation)
        return found

    def stalled(self) -> list[tuple[Rank, RankStatus]]:
        """Ranks that hang, as their peers tell: some local rank's collective timed out waiting, while these
        run on, reported nothing and are not inside a collective themselves (issue 21, D2: without
        --heartbeat-timeout nothing else finds them, and every rank waited 120 s more for a rebuild)."""
        if not self._timed_out or self.rebuild is not None:  # the usual case, every poll: nothing to read
            return []
        # a timeout in a generation the rank has left since is stale: a collective of an old group that outlasted
        # the rebuild (it times out on its own clock) says nothing about the peers of the new one
        waiting = {lr for lr, (pid, generation) in self._timed_out.items() if lr in self.table.ranks
                   and self.table[lr].pid == pid and self.table[lr].state is RankState.RUNNING
                   and (status := self.status(self.table[lr])) is not None and status.generation == generation}
        self._timed_out = {lr: self._timed_out[lr] for lr in waiting}
        if not waiting:
            return []
        found = []
        for rank in self.table.in_state(RankState.RUNNING):
            if rank.local_rank in waiting or rank.pid is None:
                continue
            status = self.status(rank)
            if status is not None and status.phase is Phase.TRAINING and status.collective_since is None \
                    and status.errors <= self._errors.get((rank.local_rank, rank.pid), 0):
                found.append((rank, status))
        return found

    def live_fault(self, local_rank: int, fault_type: str) -> bool:
        """A type-"0" fault of a running rank: stopTrain must leave it alive (it is paused, not broken)."""
        rank = self.table.get(local_rank)
        return self.enabled and fault_type == FaultType.RECOVERABLE and rank is not None \
            and rank.state is RankState.RUNNING

    # -- the generation and the control file -------------------------------------------------------
    def next_generation(self, generation: int | None = None) -> int:
        """Name the generation of this node's next recovery: the controller's (`Order.generation`, the same on
        every node) if it gave one above the newest named here, else the next of this node's own count (right
        on one node only: ClusterD gives none, nor does the degraded local restart). Never reused while the
        store lives. The one place a generation is named."""
        if generation is None or generation <= self.generation:
            generation = self.generation + 1
        self.generation = generation
        return generation

    def leave(self) -> None:
        """Tell the local ranks, through the control file, that their group is broken: each one's leave watch
        ends its connections, so every survivor is out of the group within milliseconds of the fault instead
        of when the failure reaches it along the ring. Once per generation; nothing without a group."""
        path = self.control_path
        if path is None or not self._group:
            return
        generation = self._newest_generation()
        if self._left == generation:
            return
        write_control(path, generation, "leave", timeout=RANK_TIMEOUT)
        self._left = generation
        log.debug("live recovery: ranks told to leave generation %d", generation)

    def prepare(self, local_rank: int, configured: list[str], faults: FaultRanks) -> bool:
        """Have the launcher start a dead rank's replacement now (`Launcher.prepare_replacement`), if a recover
        could replace it (configured, and not refused: `_recover_refused`). The round's decision takes several
        hops on the wire; the replacement's script (imports, model, optimizer) runs meanwhile instead of after it
        (BENCHMARKS.md). The outcome decides: `begin` of a recover lets it join, anything else discards it."""
        if not self.enabled or not self._group or Strategy.RECOVER not in configured \
                or self._recover_refused(faults):
            return False
        return self.details.prepare_replacement(local_rank, self._newest_generation())

    def begin(self, strategy: str, faults: FaultRanks, started: float, timeout: float, now: float,
              resized: resize.Resize | None = None) -> int:
        """Name the generation of a recover/retry/job-rescheduling/downgrade/upgrade on this node; the caller then
        restarts ranks. `resized`: the group's new size and rank map, kept for every later generation's control
        file (a rank restarted later forms the group at its place in it)."""
        if strategy != Strategy.RECOVER:  # before any control file names a generation a prepared one could join
            self.details.discard_prepared()
        generation = self.generation
        if resized is not None:
            self._resize = resized
        if strategy in (*Strategy.REJOIN, Strategy.RETRY):
            action = "retry" if strategy == Strategy.RETRY else "rejoin"
            place = {}
            if self._resize is not None and strategy != Strategy.RETRY:
                ranks = self._resize.of_node(r.global_rank for r in self.table.all())
                place = {"world_size": self._resize.world_size, "ranks": ranks}
            write_control(self.control_path, generation, action, timeout=RANK_TIMEOUT, **place)  # type: ignore[arg-type]
        self.details.set_generation(generation)
        wait = min(REJOIN_TIMEOUT, timeout * 0.9) if timeout > 0 else REJOIN_TIMEOUT
        self._timed_out.clear()  # what the old group's collectives waited for is this rebuild's business now
        self.rebuild = Rebuild(generation, strategy, dict(faults), started, now + wait, dict(self._steps),
                               report=strategy != Strategy.JOB_RESCHEDULING)
        log.info("live recovery: generation %d (%s)", generation, strategy)
        return generation

    def abandon(self) -> None:
        """A newer order replaces the rebuild in progress (it will never be confirmed)."""
        self.rebuild = None

    # -- confirming the rebuild -----------------------------------------------------------------------
    def check(self, now: float) -> GroupRejoined | GroupFailed | Resumed | None:
        """Where the rebuild stands, as the round machine's next event: every local rank rejoined, the group failed
        (why), training resumed; None while it waits."""
        rb = self.rebuild
        if rb is None:
            return None
        ranks = [r for r in self.table.all() if r.state is not RankState.SUCCEEDED]  # finished ranks are fine
        gone = [r.global_rank for r in ranks if not r.state.alive]
        if gone and rb.confirmed is None:
            return GroupFailed(f"rank(s) {gone} ended before the group of generation {rb.generation} re-formed")
        statuses = {r.local_rank: self.status(r) for r in ranks}

        def rejoined(r: Rank) -> bool:  # a rank of no group (independent ranks) only has to be running
            s = statuses[r.local_rank]
            if r.local_rank in self._group:
                return s is not None and s.rejoined(rb.generation)
            if rb.strategy in Strategy.REJOIN and r.local_rank not in self._declared:
                return False  # never seen here (a replacement node's new rank): a group joiner or not, it says first
            return r.state is RankState.RUNNING

        def resumed(r: Rank) -> bool:
            s = statuses[r.local_rank]
            if r.local_rank not in self._group:
                return r.global_rank not in rb.faults or (s is not None and s.heartbeat.step is not None)
            return s is not None and s.resumed(rb.generation)

        if rb.confirmed is None:
            if all(rejoined(r) for r in ranks):
                rb.confirmed = now
                return GroupRejoined(rb.generation, rb.started)
            if now >= rb.deadline:
                waiting = sorted(r.global_rank for r in ranks if not rejoined(r))
                return GroupFailed(f"rank(s) {waiting} did not rejoin generation {rb.generation} within "
                                   f"{rb.deadline - rb.started:.0f}s")
            return None
        if gone or not all(resumed(r) for r in ranks):
            return None
        recomputed = {}
        for r in ranks:
            if r.local_rank not in self._group:
                continue
            before = rb.steps_before.get(r.local_rank)
            resume = statuses[r.local_rank].resume_step if statuses.get(r.local_rank) else None  # type: ignore[union-attr]
            recomputed[r.global_rank] = max(0, before + 1 - resume) if before is not None and resume is not None \
                else 0
        self.rebuild = None
        seconds = now - rb.started
        log.info("training resumed %.3fs after the fault (generation %d, %s; steps recomputed per rank %s)", seconds,
                 rb.generation, rb.strategy, recomputed)
        return Resumed(seconds=seconds, at=now)

    def close(self) -> None:
        for hb in self._files.values():
            hb.close()
        self._files.clear()


__all__ = ["POLL", "LiveRanks", "Rebuild"]
