"""Standby agents (`taskd run --standby`): spares that wait on a job and take over the first node lost (issue 17).

A standby Inits and Registers with `ClientInfo.standby` (its nodeRank is ignored) and subscribes. It is never
one of the job's nodes: it holds no node rank, is not asked in any round and is not needed for the job to
finish. The job keeps its standbys in `Job.standbys`, by (host, pid), apart from its `AgentTable`:

- `on_register`: a new standby is taken (refused 409 past `max_standbys`), a known one refreshed;
- `on_connected`: its stream opened. It waits, unless a lost node has no standby yet (it gets it at once) or
  the job has ended (it is told `changeStrategy exit`, "job ended", and forgotten);
- `assign_waiting`: every awaited node (`Job.rejoining`) without a standby gets the longest-waiting one whose
  stream is open: `taskd.assignNode` {"node_rank": R} on that stream. Called when a node is lost, and when a
  standby's stream opens or an assigned standby goes away;
- `take`: the standby's following Register as node R (standby=false, same host and pid) is the hand-over of
  `node_loss.replace_holder`; it is a standby no more, and its standby stream is closed (its client
  resubscribes as node R);
- `unassign`: another replacement registered as R first (the lost node's recreated pod): the standby assigned R
  is free again (its own Register as R is refused, and it waits again);
- `on_disconnected`: a standby whose stream ended, or that had none for the agent loss timeout (registered
  and never subscribed, or not back after a controller restart: `Job.silent_standbys` times it), is
  forgotten (no loss round: it held nothing); a node it was assigned and did not take goes to the next one;
- `release_all`: the job ended: every standby is told `changeStrategy exit` ("job ended") and forgotten.

A job may be created by a standby's Init (the job id is the rendezvous: a spare may start before the job's
nodes); the nodes' first Init then resets it to their shape, keeping its standbys. A standby never resets a job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from taskd.controller.machine.events import AgentRegistered, Outcome, Signal, StandbyConnected, StandbyDisconnected
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import LIVE, TERMINAL, JobState
from taskd.controller.nodes import node_migration
from taskd.vocabulary import Action, Code, SignalType, Strategy

Key = tuple[str, int]
JOB_ENDED = "job ended"


@dataclass(frozen=True)
class Standby:
    """One waiting spare (replaced, never changed in place: a checkpoint copies the job's dict shallowly)."""

    host: str
    pid: int
    since: float  # registered: who waited longest is assigned first
    subscribed: bool = False
    gone_since: float | None = None  # without a stream since (registered, or restored after a controller restart)
    assigned: int | None = None  # the node rank it was sent taskd.assignNode for
    assigned_at: float | None = None
    role: str = ""


def live(m: Job, now: float) -> dict[Key, Standby]:
    """The job's standbys, those without a stream for longer than the agent loss timeout dropped first."""
    limit = m.config.agent_loss_timeout
    stale = [k for k, s in m.standbys.items() if not s.subscribed and s.gone_since is not None
             and now - s.gone_since > limit]
    if stale:
        m.standbys = {k: s for k, s in m.standbys.items() if k not in stale}
    return m.standbys


def _put(m: Job, key: Key, s: Standby | None) -> None:
    standbys = dict(m.standbys)  # a new dict: the checkpoint keeps the old one as the old state
    if s is None:
        standbys.pop(key, None)
    else:
        standbys[key] = s
    m.standbys = standbys


def on_register(m: Job, ev: AgentRegistered, now: float, out: Outcome) -> JobState:
    key = (ev.host, ev.pid)
    standbys = live(m, now)
    known = standbys.get(key)
    if known is not None:
        _put(m, key, replace(known, role=ev.role))
        out.info = f"standby for job {m.job_id} (waiting since it first registered)"
        return m.state
    held = [n for n, a in m.agents.items() if (a.host, a.pid) == key and not a.finished]
    if held:  # a standby that took a node and re-registers with its old identity must not be a spare twice
        out.code = Code.INVALID_PARAMS
        out.info = (f"{ev.host[:64]}:{ev.pid} holds node {held[0]} of job {m.job_id}: it registers as that node, "
                    "not as a standby")
        return m.state
    bound = m.config.max_standbys
    if len(standbys) >= bound:
        out.code = Code.INVALID_PARAMS
        out.info = (f"job {m.job_id} has {len(standbys)} standby agent(s) waiting, the most --max-standbys allows "
                    f"({bound}): the standby {ev.host[:64]}:{ev.pid} is refused. Start fewer spares, or the "
                    "controller with a higher --max-standbys")
        return m.state
    _put(m, key, Standby(ev.host, ev.pid, since=now, gone_since=now, role=ev.role))
    m.record(out, "standby_registered", host=ev.host, pid=ev.pid, standbys=len(m.standbys))
    out.info = (f"standby for job {m.job_id} ({m.state.value}): it takes over the first node lost, "
                "or exits 0 when the job ends")
    return m.state


def on_connected(m: Job, ev: StandbyConnected, now: float, out: Outcome) -> JobState:
    key = (ev.host, ev.pid)
    s = live(m, now).get(key)
    if s is None:
        out.code = Code.NOT_REGISTERED
        out.info = f"no standby {ev.host[:64]}:{ev.pid} in job {m.job_id} (Register with standby first)"
        return m.state
    if m.state in TERMINAL:
        out.direct.append(_exit(m))
        _put(m, key, None)
        m.record(out, "standby_released", host=ev.host, pid=ev.pid, reason=JOB_ENDED)
        return m.state
    _put(m, key, replace(s, subscribed=True, gone_since=None))
    if s.assigned is not None and (s.assigned in m.rejoining or s.assigned in m.absent):  # back before it took it
        out.direct.append(_assign_signal(m, s.assigned))
    else:
        assign_waiting(m, now, out, caller=key)
    return m.state


def on_disconnected(m: Job, ev: StandbyDisconnected, now: float, out: Outcome) -> JobState:
    key = (ev.host, ev.pid)
    s = m.standbys.get(key)
    if s is None:
        return m.state
    _put(m, key, None)
    why = (f"no signal stream for {ev.silent:g}s (--agent-loss-timeout)" if ev.silent else "its stream ended")
    m.record(out, "standby_dropped", host=ev.host, pid=ev.pid, assigned=s.assigned, reason=why)
    node_migration.on_standby_gone(m, key, now, out)  # the successor of a node migration: called off
    if s.assigned is not None and m.state in LIVE:
        assign_waiting(m, now, out)  # the node it did not take goes to the next standby
    return m.state


def assign_waiting(m: Job, now: float, out: Outcome, caller: Key | None = None) -> None:
    """Give every awaited node without a standby the longest-waiting free one with an open stream. The
    signal goes on that standby's stream (`out.direct` when it is the caller's own, else `out.to_standbys`)."""
    wanted = set(m.rejoining) | set(m.absent)  # absent: a downgrade left it out, a standby grows the job back
    if m.state not in LIVE or not wanted:
        return
    standbys = live(m, now)
    taken = {s.assigned for s in standbys.values() if s.assigned is not None}
    free = sorted(((s.since, k) for k, s in standbys.items() if s.assigned is None and s.subscribed))
    for n in sorted(wanted - taken):
        if not free:
            return
        _, key = free.pop(0)
        _put(m, key, replace(standbys[key], assigned=n, assigned_at=now))
        sig = _assign_signal(m, n)
        if key == caller:
            out.direct.append(sig)
        else:
            out.to_standbys.append((key, sig))
        m.record(out, "standby_assigned", node_rank=n, host=key[0], pid=key[1],
                 waited=round(now - standbys[key].since, 3))


def take(m: Job, ev: AgentRegistered, out: Outcome) -> Standby | None:
    """A standby registering as a node (standby=false, its own host and pid): it is one of the job's agents
    now, not a standby; its standby stream is closed so that its client subscribes as that node."""
    key = (ev.host, ev.pid)
    s = m.standbys.get(key)
    if s is None or not ev.pid:
        return None
    _put(m, key, None)
    out.to_standbys.append((key, None))
    return s


def unassign(m: Job, node_rank: int) -> None:
    """Node `node_rank` was taken by another replacement than the standby assigned it (one that registered first,
    e.g. the lost node's recreated pod): that standby waits again, free for the next node lost. Its own Register
    as the node is refused 409, and its agent goes back to waiting (agent/link/registration.py)."""
    for key, s in list(m.standbys.items()):
        if s.assigned == node_rank:
            _put(m, key, replace(s, assigned=None, assigned_at=None))


def release_all(m: Job, out: Outcome) -> None:
    """The job ended: every standby is told to exit (0: it was not needed) and forgotten."""
    if not m.standbys:
        return
    sig = _exit(m)
    for key in sorted(m.standbys):
        out.to_standbys.append((key, sig))
    m.record(out, "standby_released", standbys=[f"{h}:{p}" for h, p in sorted(m.standbys)], reason=JOB_ENDED)
    m.standbys = {}


def _assign_signal(m: Job, node_rank: int) -> Signal:
    return m.signal(SignalType.ASSIGN_NODE, (), nodes=(node_rank,), extra=(("node_rank", node_rank),), keep=False)


def _exit(m: Job) -> Signal:
    return m.signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), strategy=Strategy.EXIT,
                    reason=f"{JOB_ENDED}: job {m.job_id} is {m.state.value}; this standby was not needed", keep=False)
