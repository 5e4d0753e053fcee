"""The per-job recovery state machine (docs/controller.md, "The transition table").

It is a pure object: events go in (with the current time passed by the caller), an `Outcome`
comes out (the status to answer, signals to broadcast, events to record, agents whose record
changed) and `wake_at` says when the caller must deliver the next timer events. No I/O, no clock,
no randomness: the gRPC layer, the store and the timer stay thin, and the whole policy is testable
without sockets.

The parts, each in its own module: `events` (what goes in and comes out), `model` (states, timeouts,
a round), `agents` (the job's agents and their counts), `job` (a job's data and the steps of a
round), `strategy` (which strategy a round takes), `handlers` and `table` (which handler runs for
which event in which state, and where it may lead), `snapshot` (persisting and restoring a job).
This module applies the table (`JobMachine.handle`) and re-exports the names callers use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from taskd.controller.machine.agents import AgentInfo, AgentTable
from taskd.controller.machine.events import (
    FIRE_AND_FORGET,
    NEEDS_REGISTERED,
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentLossDue,
    AgentRegistered,
    Event,
    FaultReported,
    JobInit,
    Outcome,
    Record,
    RecoverStatusReported,
    Signal,
    StopComplete,
    StrategiesReported,
    Tick,
)
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import DECLINED, TERMINAL, JobState, MachineConfig, Round
from taskd.controller.machine.strategy import choose_strategy
from taskd.controller.machine.table import (
    RULES,
    UNCHANGED,
    Rule,
    TransitionError,
    check_target,
    describe_table,
    find_rule,
    refusal_info,
)
from taskd.controller.nodes import standby as _standby
from taskd.controller.nodes.node_loss import fence_refusal, reporter_refusal
from taskd.controller.storage import snapshot as _snapshot
from taskd.vocabulary import Code


class JobMachine(Job):
    """Recovery state of one job. Drive it with `handle(event, now)`."""

    def handle(self, event: Event, now: float) -> Outcome:
        """Apply the table's rule for this event in the current state, and check where it led."""
        out = Outcome()
        kind = type(event)
        needs_registered = kind in NEEDS_REGISTERED
        if needs_registered and event.node_rank not in self.agents:
            out.code = Code.NOT_REGISTERED
            out.info = f"node {event.node_rank} of job {self.job_id} is not registered (call Register first)"
            return out
        if why := fence_refusal(self, event, now):
            out.code = Code.FENCED
            out.info = why
            return out
        if needs_registered and (why := reporter_refusal(self, event)):
            out.code = Code.INVALID_PARAMS
            out.info = why
            return out
        rule = find_rule(kind, self.state)
        if rule is None:
            return self._refuse(event, out)
        agent = self.agents[event.node_rank] if needs_registered else None
        if agent is not None:  # a sign of life, taken back below if the call is refused: a refusal changes nothing
            seen = agent.last_seen, agent.online
            agent.last_seen = now
            self.agents.set_online(agent, True)
        source = self.state
        target = rule.handler(self, event, now, out)
        if agent is not None and (target is DECLINED or out.code != Code.OK):
            agent.last_seen = seen[0]
            self.agents.set_online(agent, seen[1])
        if target is DECLINED:
            return self._refuse(event, out)
        check_target(rule, source, target)
        if target != source:
            out.records.append(Record("state", self.round_number, {"from": source.value, "to": target.value}))
        self.state = target
        if target in TERMINAL:
            self.deadline = None
            if source not in TERMINAL:
                _standby.release_all(self, out)  # the job ended: its standbys were not needed
        if out.records or out.signals or out.agents_changed:
            self.updated_at = now
        return out

    def _refuse(self, event: Event, out: Outcome) -> Outcome:
        """No rule takes `event` now: 401 naming the states that would (timer and disconnect events: dropped)."""
        if not isinstance(event, FIRE_AND_FORGET):
            out.code = Code.OUT_OF_ORDER
            out.info = refusal_info(self.job_id, self.state, type(event))
        return out

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state to persist (see `taskd.controller.storage.snapshot`)."""
        return _snapshot.snapshot(self)

    @classmethod
    def restore(
        cls, snap: Mapping[str, Any], agents: Iterable[AgentInfo], config: MachineConfig, now: float,
        from_wall: Callable[[float], float] | None = None,
    ) -> tuple[JobMachine, Outcome]:
        """Rebuild a job after a controller restart; a round caught RECOVERING goes on where it was, one caught
        undecided waits in RESUMING (taskd.controller.storage.snapshot). `from_wall`
        re-bases the stored wall times to the caller's clock (default: they are on it already)."""
        rebase = from_wall or (lambda t: t)
        m = cls(snap["job_id"], config, rebase(snap["created_at"]) if "created_at" in snap else now)
        return m, _snapshot.restore_into(m, snap, agents, now, rebase)


__all__ = [
    "JobState", "MachineConfig", "JobMachine", "Job", "Outcome", "Signal", "Record", "AgentInfo", "AgentTable",
    "Round", "Rule", "RULES", "UNCHANGED", "TransitionError", "JobInit", "AgentRegistered", "AgentConnected",
    "AgentDisconnected", "FaultReported", "StopComplete", "StrategiesReported", "RecoverStatusReported",
    "AgentFinished", "Tick", "AgentLossDue", "Event", "TERMINAL", "describe_table", "choose_strategy",
]
