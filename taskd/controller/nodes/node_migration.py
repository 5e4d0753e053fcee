"""A planned migration of a whole node on the controller (`taskd migrate --job J --node N`, issue 34 item 4): every
rank of node N moves to a standby agent's (`taskd run --standby`) at one step boundary while the job trains on.

The controller leads it in three stages, each an event of the job's table, no round and no restart charged:

1. **prepare** (`on_migrate`): the longest-waiting free standby is assigned node N (so that no lost node takes it
   meanwhile) and told `taskd.migrate` {stage "prepare", node_rank N, generation g}. It starts node N's ranks as
   joiners of generation g (agent/ranks/node_migration.py); nothing of the job changes yet.
2. **go** (its `ready` report): every node's agent is told `taskd.migrate` {stage "go"}: it names generation g with
   action ``migrate`` and node N's ranks leaving. The ranks agree on a step boundary across nodes
   (taskd.worker.migration), the staying ranks and the successors form g, node N's ranks leave and exit 0 once g
   formed; node N's old agent then ends cleanly (exit 0, no finish reported: the node is not finished). Each
   staying node reports `joined`, with its pause measured on its own clock.
3. **held**: the standby, its ranks in g, registers as node N (`take`: the hand-over, no fence: its holder was not
   lost) and reports its final account. Once it holds the node and every staying node reported, the migration is
   done (`node_migrated`, its pause the longest of the nodes').

A migration that cannot complete is called off and says why (`migration_failed`): before *go* nothing changed;
after it, every node is told `taskd.migrate` {stage "off", generation g'}: the ranks form g' as they were (node N's
leaving ranks rejoin as themselves). The standby, if still there, is told "off" too: it stops the ranks it started
and waits again, free for the next lost node or migration. If node N's old agent had ended meanwhile, its node is
a lost node from then on (the node-loss round). Node 0 is never moved: its agent hosts the job's rendezvous store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from taskd.controller.machine.events import MigrationReported, MigrationRequested, Outcome
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import JobState, loss_clock
from taskd.vocabulary import Code, SignalType

Key = tuple[str, int]


@dataclass(frozen=True)
class NodeMove:
    """The node migration in progress (replaced, never changed in place: a checkpoint copies the job shallowly)."""

    migration: str  # the prepare signal's uuid: every report names it, the `Migrate` call waits on it
    node: int
    standby: Key  # the successor agent (host, pid)
    old: Key  # node N's agent when the migration began
    generation: int
    started: float
    stage: str = "prepare"  # prepare -> go
    held: bool = False  # the standby registered as node N
    final: bool = False  # and sent its final account
    step: int = 0
    new_pid: int = 0
    pauses: tuple[tuple[int, float], ...] = ()  # (node rank, its pause) from each staying node's `joined`


def refusal(m: Job, node: int) -> tuple[int, str]:
    """(0, "") when node `node` may move now, else (code, why); pure."""
    if m.state is not JobState.RUNNING:
        return Code.OUT_OF_ORDER, f"job {m.job_id} is {m.state.value}, not RUNNING: a migration needs a running job"
    if m.ranks_per_node <= 0:
        return Code.OUT_OF_ORDER, f"job {m.job_id}'s agents did not say how many ranks they run"
    if not 0 <= node < m.node_count:
        return Code.INVALID_PARAMS, f"node {node} is not a node of job {m.job_id} (0..{m.node_count - 1})"
    if node == 0:
        return Code.INVALID_PARAMS, (f"node 0 of job {m.job_id} hosts the job's rendezvous store (MASTER_ADDR): its "
                                     "agent cannot leave while the job runs, so node 0 is not moved live")
    if m.node_move is not None:
        return Code.OUT_OF_ORDER, f"node {m.node_move.node} of job {m.job_id} is being migrated already"
    agent = m.agents.get(node)
    if agent is None or not agent.subscribed or agent.finished:
        return Code.OUT_OF_ORDER, f"the agent of node {node} is not connected: nobody to move its ranks"
    if _free_standby(m) is None:
        return Code.OUT_OF_ORDER, (f"no standby agent waits for job {m.job_id} (`taskd run --standby`, its signal "
                                   f"stream open): node {node} has nowhere to go; the job runs as it was")
    return 0, ""


def _free_standby(m: Job) -> Key | None:
    free = sorted((s.since, k) for k, s in m.standbys.items() if s.assigned is None and s.subscribed)
    return free[0][1] if free else None


def on_migrate(m: Job, ev: MigrationRequested, now: float, out: Outcome) -> JobState:
    """Stage 1: the standby is told to prepare node N's ranks; refused: nothing is sent."""
    node = ev.node if ev.node is not None else -1
    code, why = refusal(m, node)
    if code:
        out.code, out.info = code, why
        return m.state
    key = _free_standby(m)
    assert key is not None
    m.standbys = {**m.standbys, key: replace(m.standbys[key], assigned=node, assigned_at=now)}
    generation = m.signal_seq + 1  # the signal's own number: above every generation the job named before
    sig = m.signal(SignalType.MIGRATE, (), nodes=(node,), keep=False,
                   extra=(("node_rank", node), ("generation", generation), ("stage", "prepare")))
    a = m.agents[node]
    m.node_move = NodeMove(sig.uuid, node, key, (a.host, a.pid), generation, now)
    out.to_standbys.append((key, sig))
    out.info = sig.uuid
    m.record(out, "migration_requested", node_rank=node, generation=generation, migration=sig.uuid,
             standby=f"{key[0]}:{key[1]}")
    return m.state


def on_report(m: Job, ev: MigrationReported, now: float, out: Outcome) -> JobState:
    """A stage's report of the node migration in progress (a stale or foreign one is answered and ignored)."""
    move = m.node_move
    if move is None or ev.migration != move.migration:
        out.info = f"migration {ev.migration} is not in progress"
        return m.state
    if not ev.migrated:
        return _fail(m, move, ev.reason or "a node said it could not go on", now, out)
    if ev.stage == "ready" and move.stage == "prepare" and (ev.host, ev.pid) == move.standby:
        m.node_move = replace(move, stage="go")
        sig = m.signal(SignalType.MIGRATE, (), nodes=tuple(sorted(m.agents)), keep=False,
                       extra=(("node_rank", move.node), ("generation", move.generation), ("stage", "go"),
                              ("migration", move.migration)))
        out.signals.append(sig)
        m.record(out, "migration_ready", node_rank=move.node, migration=move.migration,
                 seconds=round(now - move.started, 3))
    elif ev.stage == "joined" and move.stage == "go":
        pauses = dict(move.pauses)
        pauses[ev.node_rank] = ev.pause_seconds
        m.node_move = replace(move, pauses=tuple(sorted(pauses.items())), step=ev.step or move.step)
    elif ev.stage == "" and move.held and (ev.host, ev.pid) == move.standby:
        m.node_move = replace(move, final=True, new_pid=ev.new_pid, step=ev.step or move.step)
    return _done_if_complete(m, now, out)


def take(m: Job, node: int, host: str, pid: int, now: float, out: Outcome) -> bool:
    """Stage 3: whether a Register as `node` from (`host`, `pid`) is the successor's hand-over (then done here)."""
    move = m.node_move
    if move is None or move.stage != "go" or move.node != node or (host, pid) != move.standby:
        return False
    a = m.agents[node]
    m.standbys = {k: s for k, s in m.standbys.items() if k != move.standby}
    m.agents.set_subscribed(a, False)  # the old agent's stream is replaced by the successor's
    m.agents.set_gone(a, now, loss_clock(m.config, "silent"))  # until the successor's stream opens
    m.node_move = replace(move, held=True)
    out.to_standbys.append((move.standby, None))  # its client subscribes again, as node N
    m.record(out, "node_replaced", node_rank=node, old_host=move.old[0], old_pid=move.old[1], host=host, pid=pid,
             standby=True, migration=move.migration)
    return True


def old_agent_left(m: Job, node: int) -> bool:
    """Whether node `node`'s stream ended because its agent ended after its ranks left (no loss clock then)."""
    move = m.node_move
    return move is not None and move.stage == "go" and move.node == node and not move.held


def on_standby_gone(m: Job, key: Key, now: float, out: Outcome) -> None:
    """The successor went away before it held the node: the migration is called off."""
    move = m.node_move
    if move is not None and move.standby == key and not move.held:
        _fail(m, move, f"the standby {key[0]}:{key[1]} went away", now, out)


def _done_if_complete(m: Job, now: float, out: Outcome) -> JobState:
    move = m.node_move
    assert move is not None
    staying = {n for n in m.agents if n != move.node}
    if not (move.held and move.final and staying <= {n for n, _ in move.pauses}):
        return m.state
    m.node_move = None
    pause = max((p for _, p in move.pauses), default=0.0)
    host, pid = move.standby
    m.record(out, "migrated", node_rank=move.node, migration=move.migration, generation=move.generation,
             trigger="taskd migrate", old_host=move.old[0], old_pid=move.old[1], host=host, pid=pid, step=move.step,
             pause_seconds=round(pause, 6), node_pauses={str(n): round(p, 6) for n, p in move.pauses},
             seconds=round(now - move.started, 3))
    out.settled = MigrationReported(node_rank=move.node, host=host, pid=pid, migration=move.migration,
                                    migrated=True, rank=-1, old_pid=move.old[1], new_pid=pid, step=move.step,
                                    pause_seconds=pause, generation=move.generation, stage="node")
    return m.state


def _fail(m: Job, move: NodeMove, why: str, now: float, out: Outcome) -> JobState:
    """Call it off: the standby is freed, the ranks told to go on as they were (once told to move)."""
    m.node_move = None
    if move.standby in m.standbys:  # free for the next lost node or migration
        m.standbys = {**m.standbys, move.standby: replace(m.standbys[move.standby], assigned=None, assigned_at=None)}
    off = (("node_rank", move.node), ("generation", m.signal_seq + 1), ("stage", "off"), ("migration", move.migration))
    if move.stage == "go" and not move.held:
        out.signals.append(m.signal(SignalType.MIGRATE, (), nodes=tuple(sorted(m.agents)), keep=False, extra=off))
        a = m.agents.get(move.node)
        if a is not None and not a.subscribed and a.gone_since is None and not a.finished:
            m.agents.set_gone(a, now, loss_clock(m.config, "ended"))  # its agent ended: a lost node from here
    if move.standby in m.standbys and not move.held:  # the successor stops the ranks it started and waits again
        out.to_standbys.append((move.standby, m.signal(SignalType.MIGRATE, (), nodes=(), keep=False, extra=off)))
    reason = f"called off: {why}; the job runs as it was"
    m.record(out, "migration_failed", node_rank=move.node, migration=move.migration, generation=move.generation,
             trigger="taskd migrate", reason=reason)
    out.settled = MigrationReported(node_rank=move.node, migration=move.migration, migrated=False, reason=reason,
                                    rank=-1, generation=move.generation, stage="node")
    return m.state


__all__ = ["NodeMove", "old_agent_left", "on_migrate", "on_report", "on_standby_gone", "refusal", "take"]
