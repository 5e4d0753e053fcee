"""Undo one event: what the core puts back when the change an event made could not be stored.

The core commits a job's change before anyone hears of it. When that commit fails (a full disk, an
I/O error, a value SQLite cannot hold) the store rolls back, and memory must go back too, or the job
in memory and the job a restart loads would differ. Copying the job before every event would cost
O(agents) per event (O(agents^2) per round), so a `Checkpoint` copies only what is small and keeps
the rest by reference:

- the job's and the round's attributes (a shallow copy), and copies of their small containers (the
  fault sets, the strategies excluded, failed and tried, the fault sets broadcast);
- of the containers that grow with the agents (the `AgentTable`, a round's `acks`, `reports`,
  `statuses` and `participants`), only the reference, their sizes and the entries of the event's own
  node. Handlers change those containers in place only at the event's node; anything else replaces
  them (a reset makes a new `AgentTable`, a new phase new sets), so the old reference is the old state.

`restore` says whether the result is exact (sizes and counts as before); the core reloads the job from
the store when it is not, which only a handler breaking that rule could cause.
"""

from __future__ import annotations

from typing import Any

from taskd.controller.machine.agents import AgentInfo
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import Round

_SMALL_JOB = ("queued", "rejoining", "absent", "fences", "standbys")
_SMALL_ROUND = ("faults", "excluded", "failed", "tried", "broadcast_sets", "lost")
_MISSING = object()


def _copy(value: Any) -> Any:
    return value.copy() if value is not None else None


class Checkpoint:
    """The state of `job` before one event at node `node` (None: an event of no node, e.g. a timer)."""

    __slots__ = ("job", "node", "attrs", "small", "round", "round_attrs", "round_small", "node_in", "sizes",
                 "agent", "counts", "clocked")

    def __init__(self, job: Job, node: int | None) -> None:
        self.job = job
        self.node = node
        self.attrs = dict(vars(job))
        self.small = {name: _copy(self.attrs[name]) for name in _SMALL_JOB}
        r: Round | None = job.round
        self.round = r
        self.round_attrs = dict(vars(r)) if r is not None else {}
        self.round_small = {name: _copy(self.round_attrs[name]) for name in _SMALL_ROUND} if r is not None else {}
        self.node_in: tuple[Any, ...] = ()
        self.sizes: tuple[int, ...] = ()
        if r is not None:
            self.node_in = (node in r.acks, r.reports.get(node, _MISSING), node in r.statuses, node in r.participants)
            self.sizes = (len(r.acks), len(r.reports), len(r.statuses), len(r.participants))
        table = job.agents
        a = table.get(node) if node is not None else None
        self.agent: AgentInfo | None = a.copy() if a is not None else None
        # a timer event may declare agents lost (their clocks stopped, marked offline): those whose clock runs
        self.clocked = {n: table[n].copy() for n in table.clocked()} if node is None else {}
        self.counts = (len(table), table.online_count, table.subscribed_count, table.finished_ok_count)

    def restore(self) -> bool:
        """Put the job back as it was; False if what came back is not exactly the state before."""
        job, r = self.job, self.round
        vars(job).clear()
        vars(job).update(self.attrs)
        for name, value in self.small.items():
            setattr(job, name, value)
        exact = True
        if r is not None:
            vars(r).clear()
            vars(r).update(self.round_attrs)
            for name, value in self.round_small.items():
                setattr(r, name, value)
            exact = self._restore_node(r)
        table = job.agents
        if self.node is not None:
            table.put_back(self.node, self.agent)
        for n, saved in self.clocked.items():
            table.put_back(n, saved)
        counts = (len(table), table.online_count, table.subscribed_count, table.finished_ok_count)
        return exact and counts == self.counts

    def _restore_node(self, r: Round) -> bool:
        n = self.node
        in_acks, report, in_statuses, in_participants = self.node_in
        for values, was_in in ((r.acks, in_acks), (r.statuses, in_statuses), (r.participants, in_participants)):
            if was_in:
                values.add(n)  # type: ignore[arg-type]
            else:
                values.discard(n)
        if report is _MISSING:
            r.reports.pop(n, None)  # type: ignore[arg-type]
        else:
            r.reports[n] = report  # type: ignore[index]
        return (len(r.acks), len(r.reports), len(r.statuses), len(r.participants)) == self.sizes
