"""A job as JSON for the store, and back after a controller restart.

The format is the one taskd has always written (the store keeps it in `jobs.snapshot`); keys added
later are read with a default, so state files written by older versions still load. What a restart does
to a round depends on how far it got (docs/controller.md, "Persistence"): a round whose strategy was chosen
(RECOVERING) resumes where it was, with the agents' statuses already counted and the same changeStrategy
(its uuid and live generation) re-sent only to the agents that still owe one; an undecided round waits in
RESUMING for its agents, then runs its stop and collection again, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from taskd.controller.clock import identity
from taskd.controller.machine import resumed
from taskd.controller.machine.agents import AgentInfo
from taskd.controller.machine.events import Outcome, Record, Signal
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import ROUND_STATES, TERMINAL, Fence, JobState, Round, fmt_faults, loss_clock
from taskd.controller.nodes.standby import Standby

Times = Callable[[float], float]


def _opt(convert: Times, t: float | None) -> float | None:
    return None if t is None else convert(t)


def snapshot(m: Job, to_wall: Times = identity) -> dict[str, Any]:
    """JSON-able state to persist; the agents are persisted apart (the store's `agents` table).
    Times are stored as wall times (`to_wall`: see taskd.controller.clock for the rule)."""
    r = m.round
    return {
        "job_id": m.job_id,
        "state": m.state.value,
        "created_at": to_wall(m.created_at),
        "updated_at": to_wall(m.updated_at),
        "node_count": m.node_count,
        "ranks_per_node": m.ranks_per_node,
        "max_restarts": m.max_restarts,
        "policy": list(m.policy),
        "restarts": m.restarts,
        "round_counter": m.round_counter,
        "queued": {str(k): v for k, v in m.queued.items()},
        "deadline": _opt(to_wall, m.deadline),  # for the record: a restart never reads it back
        "recover_succeeded_at": _opt(to_wall, m.recover_succeeded_at),
        "unsettled_recovers": m.unsettled_recovers,
        "recover_banned": m.recover_banned,
        "info": m.info,
        "signal_seq": m.signal_seq,
        "rejoining": {str(n): to_wall(t) for n, t in m.rejoining.items()},
        "min_nodes": m.min_nodes,
        "absent": {str(n): to_wall(t) for n, t in m.absent.items()},
        "fences": [[f.node_rank, f.host, f.pid, to_wall(f.lost_at), f.by_host, f.by_pid,
                    _opt(to_wall, f.replaced_at), f.standby] for f in m.fences.values()],
        "standbys": [[s.host, s.pid, to_wall(s.since), s.assigned, s.role] for s in m.standbys.values()],
        "resume_watch": resumed.to_json(m.resume_watch, to_wall),
        "last_signal": _signal_json(m.last_signal),
        "round": None if r is None else {
            "number": r.number,
            "started_at": to_wall(r.started_at),
            "faults": {str(k): v for k, v in r.faults.items()},
            "excluded": r.excluded,
            "failed": r.failed,
            "tried": r.tried,
            "strategy": r.strategy,
            "lost": {str(n): to_wall(t) for n, t in r.lost.items()},
            # the decided round's progress, so that a restart resumes it instead of running it again
            "participants": sorted(r.participants),
            "statuses": sorted(r.statuses),
            "reports": {str(n): list(s) for n, s in r.reports.items()},  # the offers a next strategy is chosen from
            "unrejoined": r.unrejoined,
            "strategy_started_at": to_wall(r.strategy_started_at) if r.strategy_started_at else 0.0,
        },
    }


def _signal_json(sig: Signal | None) -> dict[str, Any] | None:
    if sig is None:
        return None
    return {"uuid": sig.uuid, "signal_type": sig.signal_type, "actions": list(sig.actions),
            "faults": [[r, t] for r, t in sig.faults], "strategy": sig.strategy, "timeout": sig.timeout,
            "reason": sig.reason, "nodes": list(sig.nodes), "generation": sig.generation, "restarts": sig.restarts,
            "round": sig.round, "extra": [[k, v] for k, v in sig.extra]}


def _signal(d: Mapping[str, Any] | None) -> Signal | None:
    if not d:
        return None
    return Signal(uuid=str(d["uuid"]), signal_type=str(d["signal_type"]), actions=tuple(d["actions"]),
                  faults=tuple((int(r), str(t)) for r, t in d["faults"]), strategy=str(d["strategy"]),
                  timeout=int(d["timeout"]), reason=str(d["reason"]), nodes=tuple(int(n) for n in d["nodes"]),
                  generation=int(d["generation"]), restarts=int(d["restarts"]), round=int(d["round"]),
                  extra=tuple((str(k), v) for k, v in d.get("extra", ())))


def _resumable(m: Job, rs: Mapping[str, Any]) -> bool:
    """A RECOVERING round stored with its progress and its changeStrategy: it resumes where it was."""
    sig = m.last_signal
    return (m.state == JobState.RECOVERING and bool(rs.get("strategy")) and "statuses" in rs and sig is not None
            and sig.round == rs["number"] and sig.strategy == rs["strategy"])


def restore_into(m: Job, snap: Mapping[str, Any], agents: Iterable[AgentInfo], now: float,
                 from_wall: Times = identity) -> Outcome:
    """Load `snap` and `agents` into the fresh job `m` (made with the snapshot's id and creation time).

    Every stream closed with the old controller: agents come back offline, each with a whole loss timeout
    to resubscribe; a round caught RECOVERING goes on where it was, one caught undecided waits in RESUMING (the
    returned outcome records either). Stored
    wall times are re-based to `now`'s clock by `from_wall` (taskd.controller.clock)."""
    m.state = JobState(snap["state"])
    m.updated_at = from_wall(snap["updated_at"]) if "updated_at" in snap else now
    m.agents.set_node_count(snap["node_count"])
    m.ranks_per_node = snap.get("ranks_per_node", 0)
    m.max_restarts = snap["max_restarts"]
    m.policy = tuple(snap.get("policy", ()))
    m.restarts = snap.get("restarts", 0)
    m.round_counter = snap.get("round_counter", 0)
    m.queued = {int(k): v for k, v in snap.get("queued", {}).items()}
    m.recover_succeeded_at = _opt(from_wall, snap.get("recover_succeeded_at"))
    m.unsettled_recovers = snap.get("unsettled_recovers", 0)
    m.recover_banned = snap.get("recover_banned", False)
    m.info = snap.get("info", "")
    m.signal_seq = snap.get("signal_seq", 0)
    m.rejoining = {int(n): from_wall(t) for n, t in snap.get("rejoining", {}).items()}
    m.min_nodes = int(snap.get("min_nodes", 0))
    m.absent = {int(n): from_wall(t) for n, t in snap.get("absent", {}).items()}
    m.resume_watch = resumed.from_json(snap.get("resume_watch"), from_wall)
    for n, host, pid, lost_at, by_host, by_pid, replaced_at, standby in snap.get("fences", []):
        m.fences[(n, host, pid)] = Fence(n, host, pid, from_wall(lost_at), by_host, by_pid,
                                         _opt(from_wall, replaced_at), standby)
    for host, pid, since, assigned, role in snap.get("standbys", []):  # back without a stream, as every agent
        m.standbys[(host, pid)] = Standby(host, pid, from_wall(since), gone_since=now, assigned=assigned, role=role)
    for given in agents:
        a = given.copy()  # the caller's objects stay theirs (and their job's counts right)
        a.registered_at = from_wall(a.registered_at) if a.registered_at else 0.0
        a.last_seen = from_wall(a.last_seen) if a.last_seen else 0.0
        m.agents.add(a)
        m.agents.set_online(a, False)
        m.agents.set_subscribed(a, False)
        m.agents.set_gone(a, None if a.finished or m.state in TERMINAL or (a.node_rank, a.host, a.pid) in m.fences
                          else now, loss_clock(m.config, "silent"))
    m.last_signal = _signal(snap.get("last_signal"))
    rs = snap.get("round")
    if rs is not None:
        m.round = Round(
            number=rs["number"], started_at=from_wall(rs["started_at"]),
            faults={int(k): v for k, v in rs["faults"].items()},
            participants=m.expected_nodes() - set(m.rejoining), excluded=dict(rs.get("excluded", {})),
            failed=list(rs.get("failed", [])), tried=list(rs.get("tried", [])), strategy=rs.get("strategy", ""),
            lost={int(n): from_wall(t) for n, t in rs.get("lost", {}).items()},
        )
    out = Outcome()
    if m.round is not None and rs is not None and _resumable(m, rs):
        _resume_in_place(m, rs, now, from_wall, out)
    elif m.state in ROUND_STATES and m.round is not None:
        out.records.append(Record("state", m.round.number, {"from": m.state.value, "to": JobState.RESUMING.value}))
        m.state = JobState.RESUMING
        m.deadline = now + m.config.resume_timeout
        out.records.append(Record("round_resuming", m.round.number, {"faults": fmt_faults(m.round.faults)}))
    else:
        m.state = JobState.RUNNING if m.state in ROUND_STATES else m.state
        m.deadline = None
    return out


def _resume_in_place(m: Job, rs: Mapping[str, Any], now: float, from_wall: Times, out: Outcome) -> None:
    """RECOVERING goes on: the agents carry out the changeStrategy they have (or get it again as they resubscribe,
    the same uuid and generation: an agent drops a uuid it already handled, agent/link/controller.py) and report
    their statuses, which count with those counted before the restart. A whole recover timeout from now."""
    r = m.round
    assert r is not None
    r.participants = {int(n) for n in rs.get("participants", sorted(r.participants))}
    r.statuses = {int(n) for n in rs["statuses"]}
    r.reports = {int(n): tuple(s) for n, s in rs.get("reports", {}).items()}
    r.unrejoined = bool(rs.get("unrejoined", False))
    started = rs.get("strategy_started_at") or 0.0
    r.strategy_started_at = from_wall(started) if started else now
    m.deadline = now + m.config.recover_timeout
    m.record(out, "round_restored", state=m.state.value, strategy=r.strategy, statuses=sorted(r.statuses),
             awaiting=sorted(r.participants - r.statuses))
