"""A node migration on the agent (`taskd migrate --node N`; the controller's half is
taskd/controller/nodes/node_migration.py): every rank of node N moves to a standby agent's at one step boundary.

Each agent plays one role, from the controller's `taskd.migrate` orders (extraParams stage, node_rank, generation):

- **successor** (a standby, stage "prepare"): it becomes node N without registering as it yet (the launcher's node
  rank, the rank table), names generation g (its control file says ``migrate`` of g with ``node``, as the job's
  nodes' will: every rank that joins g knows it joins a node move) and starts N's ranks (warm spares if it has
  them): each is a joiner of g, waiting in `LiveGroup()` for the group to form. Once every one declared itself it
  reports "ready". Once every one has joined g (past the state sync: the group formed) it registers as node N
  (the controller's hand-over), and the machine runs the node (`Took`); then it sends its final account. Anything
  else ends it: its ranks are stopped, the migration called off with why, and the standby gives the node back and
  waits again (`GaveUp`).
- **staying** (stage "go", another node): it names g with action ``migrate`` and N's ranks leaving; its ranks leave
  g-1 at the boundary every rank agreed on and form g with the successors. Once they all joined it reports
  "joined", with this node's pause: from its first rank's end of the last step before the boundary to its last
  rank's state synced in g, on this host's clock.
- **leaving** (stage "go", node N itself): the same control file; its ranks leave and exit 0 once g formed without
  them (taskd.worker.migration). When they all have, the node has moved: the agent ends with exit 0 and sends no
  finish (its node is not finished: its successor runs it).

Stage "off" (the controller called it off): a staying or leaving node (after "go") names the controller's new
generation with ``rejoin``, and its ranks form it as they were; the successor stops the ranks it started, gives the
node back and waits again as a standby (`GaveUp`, no report: the controller called it off itself).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from taskd.agent.link.controller import ControllerLink
from taskd.agent.ranks.control import RankControl
from taskd.agent.ranks.live import RANK_TIMEOUT, LiveRanks
from taskd.agent.ranks.migration import FORM_TIMEOUT, READY_TIMEOUT, keep_beats, pause_seconds
from taskd.agent.ranks.table import RankState, RankTable
from taskd.worker.live import Phase, write_control

log = logging.getLogger("taskd.agent")


@dataclass(frozen=True)
class Took:
    """The successor holds node N now: its ranks already run (the machine's RUNNING, no start)."""

    node_rank: int


@dataclass(frozen=True)
class GaveUp:
    """The successor could not take the node: its ranks were stopped, its node given back; it waits again."""

    reason: str


@dataclass
class NodeMove:
    """This agent's part in one node migration."""

    migration: str
    node: int
    generation: int
    role: str  # successor | staying | leaving
    deadline: float
    ready: bool = False  # the successor said "ready"
    beats: dict[int, dict[int, float]] = field(default_factory=dict)  # global rank -> {step: heartbeat time}


def node_ranks(table: RankTable, node: int) -> list[int]:
    """The global ranks of ``node`` (the ranks that leave it), by the rank table's layout."""
    per_node = table.layout.ranks_per_node if table.layout is not None else 0
    return list(range(node * per_node, (node + 1) * per_node))


class NodeMoves:
    """This agent's node migration, driven by the controller's orders and polled from the supervisor's loop."""

    def __init__(self, table: RankTable, live: LiveRanks, control: RankControl, link: ControllerLink,
                 lay_out: Callable[[int], object]) -> None:
        self.table = table
        self.live = live
        self.control = control
        self.link = link
        self.lay_out = lay_out  # the supervisor's: the rank table laid out as node N (MONITOR), no registration
        self.active: NodeMove | None = None
        self.moved = ""  # a leaving node's, once its ranks left: what this agent's summary says instead of success
        self._called_off: GaveUp | None = None  # a successor's, told "off" by the controller: `poll` returns it

    def order(self, migration: str, stage: str, node: int | None, generation: int | None, refused: str,
              busy: str, now: float) -> None:
        """One of the controller's `taskd.migrate` orders of a node migration (``busy``: another is under way)."""
        if node is None or generation is None:
            return self._report(migration, False, f"the {stage or 'migrate'} order named no node or generation")
        if stage == "prepare":
            return self._prepare(migration, node, generation, refused or busy, now)
        if stage == "go":
            return self._go(migration, node, generation, refused or busy, now)
        if stage == "off":
            return self._off(migration, generation)
        log.warning("taskd.migrate %s: unknown stage %r: ignored", migration, stage)

    # -- the successor ---------------------------------------------------------------------------
    def _prepare(self, migration: str, node: int, generation: int, why: str, now: float) -> None:
        if not why and not self.live.details.live_recovery:
            why = "this standby's launcher has no live recovery (taskd run, a LiveGroup script)"
        if why:
            return self._report(migration, False, f"the standby cannot take node {node}: {why}", stage="ready")
        try:
            self.live.details.set_node_rank(node)
            self.lay_out(node)
        except (RuntimeError, ValueError) as exc:
            return self._report(migration, False, f"the standby cannot take node {node}: {exc}", stage="ready")
        self.live.next_generation(generation)
        self.live.details.set_generation(generation)
        code, gone = self.control.start(None)  # (the launcher clears the control file first)
        # the move, as the job's nodes will name it: the ranks read it once g formed, which is after their "ready"
        write_control(self.live.control_path, generation, "migrate", timeout=RANK_TIMEOUT,  # type: ignore[arg-type]
                      leaving=node_ranks(self.table, node), node=True)
        self.active = NodeMove(migration, node, generation, "successor", now + READY_TIMEOUT)
        log.info("node migration %s: this standby starts node %d's ranks (rank:pid %s) to join generation %d%s",
                 migration, node, self.table.pids(), generation, "" if code == 0 else f"; start returned {code}")

    def _successor(self, m: NodeMove, now: float) -> Took | GaveUp | None:
        ranks = self.table.all()
        if any(not r.state.alive for r in ranks):
            return self._give_up(m, f"rank(s) {[r.global_rank for r in ranks if not r.state.alive]} of the successor "
                                    "ended before the group formed")
        statuses = [self.live.status(r) for r in ranks]
        if not m.ready:
            if all(s is not None and s.declared and s.can_rejoin and s.phase is Phase.REJOINING for s in statuses):
                m.ready, m.deadline = True, now + FORM_TIMEOUT
                log.info("node migration %s: node %d's ranks wait to join generation %d", m.migration, m.node,
                         m.generation)
                self._report(m.migration, True, stage="ready")
            elif now >= m.deadline:
                return self._give_up(m, f"the successor's ranks did not reach LiveGroup() within {READY_TIMEOUT:.0f}s")
            return None
        if not all(s is not None and s.rejoined(m.generation) for s in statuses):
            if now >= m.deadline:
                return self._give_up(m, f"generation {m.generation} did not form within {FORM_TIMEOUT:.0f}s")
            return None
        layout = self.table.layout
        if layout is None or not self.link.register_as(layout):  # type: ignore[arg-type]
            return self._give_up(m, f"the controller did not let this standby register as node {m.node}")
        self.active = None
        step = min((s.resume_step or 0) for s in statuses if s is not None)
        log.info("node migration %s: this agent holds node %d now; its ranks (rank:pid %s) trained on from step %d "
                 "in generation %d", m.migration, m.node, self.table.pids(), step, m.generation)
        self._report(m.migration, True, new_pid=os.getpid(), step=step)
        return Took(m.node)

    def _give_up(self, m: NodeMove, why: str, report: bool = True) -> GaveUp:
        self.active = None
        self.control.stop(self.table.alive(), graceful=False)
        try:  # a standby again: no node rank, no rank table (a lost node or another migration lays them out anew)
            self.live.details.set_node_rank(None)
        except (RuntimeError, ValueError) as exc:
            log.debug("node rank not given back: %s", exc)
        self.table.clear()
        reason = f"the successor could not take node {m.node}: {why}"
        if report:
            self._report(m.migration, False, reason)
        return GaveUp(reason)

    # -- the job's nodes -------------------------------------------------------------------------
    def _go(self, migration: str, node: int, generation: int, why: str, now: float) -> None:
        layout = self.table.layout
        if not why and not self.live.enabled:
            why = "the job has no live recovery (its script does not use LiveGroup, or TASKD_RDZV_STORE=rank)"
        if not why and generation <= self.live.generation:
            why = f"this node already named generation {self.live.generation} (>= {generation})"
        if why or layout is None:
            return self._report(migration, False, f"node {layout.node_rank if layout else '?'} cannot take part: "
                                f"{why or 'no ranks laid out'}", stage="joined")
        leaving = node_ranks(self.table, node)
        self.live.next_generation(generation)
        write_control(self.live.control_path, generation, "migrate", timeout=RANK_TIMEOUT,  # type: ignore[arg-type]
                      leaving=leaving, node=True)
        self.live.details.set_generation(generation)
        role = "leaving" if layout.node_rank == node else "staying"
        self.link.hand_over(role == "leaving")  # its stream passes to the successor: expected, not a fault
        self.active = NodeMove(migration, node, generation, role, now + FORM_TIMEOUT)
        log.info("node migration %s: ranks %s move to a standby; this node's ranks %s at their next step boundary "
                 "(generation %d)", migration, leaving, "leave" if role == "leaving" else "stay and re-form the group",
                 generation)

    def _staying(self, m: NodeMove, now: float) -> None:
        ranks = self.table.all()
        keep_beats(ranks, self.live, m.generation, m.beats)
        statuses = {r.global_rank: self.live.status(r) for r in ranks}
        if not all(s is not None and s.rejoined(m.generation) for s in statuses.values()):
            if now >= m.deadline:
                self.active = None
                self._report(m.migration, False, f"generation {m.generation} did not form within "
                             f"{FORM_TIMEOUT:.0f}s on node {self.table.layout.node_rank if self.table.layout else '?'}",
                             stage="joined")
            return
        self.active = None
        step = min((s.resume_step or 0) for s in statuses.values() if s is not None)
        left = {r: beats[step - 1] for r, beats in m.beats.items() if step - 1 in beats}
        pause = pause_seconds(left, {r: s.joined_time or 0.0 for r, s in statuses.items() if s is not None})
        log.info("node migration %s: this node's ranks trained on in generation %d from step %d: training paused "
                 "%.3fs here (from its first rank's end of step %d to its last rank's state synced)", m.migration,
                 m.generation, step, pause, step - 1)
        self._report(m.migration, True, step=step, pause=pause, stage="joined")

    def _leaving(self, m: NodeMove) -> None:
        ranks = self.table.all()
        if ranks and all(r.state is RankState.SUCCEEDED for r in ranks):
            self.active = None
            self.link.reports.handed_over = True  # no finish: the node goes on, run by its successor
            self.moved = f"node {m.node} migrated to a standby agent (node migration {m.migration})"
            log.info("node migration %s: this node's ranks left at their step boundary and the group re-formed "
                     "without them: node %d runs on its successor; this agent ends (exit 0)", m.migration, m.node)

    def _off(self, migration: str, generation: int) -> None:
        m = self.active
        if m is None or m.migration != migration:
            return
        if m.role == "successor":  # called off by the controller (a node could not take part, a timeout)
            self._called_off = self._give_up(m, "the controller called the migration off", report=False)
            return
        self.active = None
        self.link.hand_over(False)
        generation = self.live.next_generation(generation)
        write_control(self.live.control_path, generation, "rejoin", timeout=RANK_TIMEOUT)  # type: ignore[arg-type]
        self.live.details.set_generation(generation)
        log.warning("node migration %s called off: this node's ranks form generation %d as they were", migration,
                    generation)

    def ending(self) -> None:
        """The agent ends (its ranks all exited): a leaving node's exits may be seen only now, past the last poll."""
        if self.active is not None and self.active.role == "leaving":
            self._leaving(self.active)

    def poll(self, now: float) -> Took | GaveUp | None:
        if self._called_off is not None:
            done, self._called_off = self._called_off, None
            return done
        m = self.active
        if m is None:
            return None
        if m.role == "successor":
            return self._successor(m, now)
        if m.role == "staying":
            self._staying(m, now)
        else:
            self._leaving(m)
        return None

    def _report(self, migration: str, migrated: bool, reason: str = "", stage: str = "", step: int = 0,
                pause: float = 0.0, new_pid: int = 0) -> None:
        if not migrated:
            log.warning("node migration %s: %s", migration, reason)
        self.link.reports.migration(migration=migration, migrated=migrated, reason=reason, rank=-1, newPid=new_pid,
                                    step=step, pauseSeconds=pause, stage=stage)


__all__ = ["GaveUp", "NodeMove", "NodeMoves", "Took"]
