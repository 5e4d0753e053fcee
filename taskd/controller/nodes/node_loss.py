"""A lost node is survived: the rules that turn an agent's loss into a node-loss round, take in its
replacement, and fence the lost identity (issue 17; docs/controller.md, "A lost node").

The steps, each a handler or helper the table (`taskd.controller.machine.table`) or another handler calls:

- `on_agent_lost`: agents past their loss deadline are declared lost, their identity (node rank, host,
  pid) fenced, and a round opened (or the open one widened) whose faults are every rank of those nodes;
  the survivors get stopTrain/globalFault as for any fault, the lost agents are waited for no more.
- `replace_holder`: a Register for a node awaited (`Job.rejoining`) from another process is the atomic
  hand-over: the node's holder becomes the caller, the lost identity stays fenced, and the fence names
  who replaced it, all in the one change the Register commits.
- `rejoined`: the replacement subscribed (`handlers.on_connected_rejoining` then decides once no node is
  awaited).
- `on_rejoin_timeout`: no replacement within `node_rejoin_timeout`: the job fails, saying how to add one
  (unless it opted in to go on smaller: `taskd.controller.nodes.resize` decides first).
- `fence_refusal`: what any event from a fenced identity is answered (411), in every job state;
- `reporter_refusal`: what a report from another process than its node's registered agent is answered (409).
"""

from __future__ import annotations

from dataclasses import replace

from taskd.controller.machine.agents import AgentInfo
from taskd.controller.machine.events import (
    AgentConnected,
    AgentRegistered,
    Event,
    MigrationReported,
    Outcome,
    RejoinDue,
)
from taskd.controller.machine.job import Job
from taskd.controller.machine.model import TERMINAL, Fence, JobState, fmt_faults
from taskd.controller.nodes import standby
from taskd.vocabulary import FaultRanks, FaultType

S = JobState

HOW_TO_ADD = ("start `taskd run --node-rank {node} ...` (the job's other flags) on a new host, or have a "
              "`taskd run --standby` agent waiting")


def _nodes(nodes: list[int]) -> str:
    return ", ".join(map(str, nodes))


def node_ranks(m: Job, a: AgentInfo) -> range:
    """The global ranks of agent `a`'s node (empty when nobody said how many ranks a node has)."""
    per_node = a.ranks_per_node or m.ranks_per_node
    return range(a.node_rank * per_node, (a.node_rank + 1) * per_node) if per_node > 0 else range(0)


def on_agent_lost(m: Job, ev: Event, now: float, out: Outcome) -> JobState:
    """Agents past their loss deadline (stream ended and not back within the grace, or silent for the loss
    timeout) took their ranks with them. The job goes on without them for now: a round opens for their
    ranks, and waits up to `node_rejoin_timeout` for a replacement of each node."""
    due = m.agents.lost_by(now)
    if not due:
        return m.state  # came back, or finished, since the timer was set
    nodes = sorted(due)
    faults: FaultRanks = {}
    why = ""
    for n in nodes:
        a = due[n]
        ranks = node_ranks(m, a)
        if not ranks:  # a ClusterD-wire agent sends no ranksPerNode: no round can name the node's ranks
            why = "nothing can restart " + ("its ranks" if len(nodes) == 1 else "their ranks")
        faults.update({r: FaultType.PROCESS for r in ranks})
    lost = {n: (due[n], now - (due[n].gone_since or now)) for n in nodes}
    for n, (a, _) in lost.items():
        m.fences[(n, a.host, a.pid)] = Fence(node_rank=n, host=a.host, pid=a.pid, lost_at=now)
        m.agents.set_gone(a, None)  # declared lost: its loss clock has done its work
        m.agents.set_online(a, False)
        m.rejoining.setdefault(n, now)
    finished = sorted(n for n, a in m.agents.items() if a.finished_ok)
    if finished and not why:
        why = f"node(s) {_nodes(finished)} had finished: no recovery without them"
    if why:
        _record_losses(m, lost, out, "agent_lost")
        m.rejoining.clear()
        seconds = max(s for _, s in lost.values())
        who = f"agent of node {nodes[0]}" if len(nodes) == 1 else f"agents of nodes {_nodes(nodes)}"
        return m.fail(f"{who} lost for {seconds:.0f}s: {why}", now, out,
                      notify=any(not a.finished for n, a in m.agents.items() if n not in lost))
    standby.assign_waiting(m, now, out)  # the longest-waiting standby takes each lost node
    # the round counts from each node's fault (its stream's end, or its last word), not from this declaration a
    # grace later: the survivors' "training resumed N s after the fault" then says what it names (issue 32, F6)
    fault_at = {n: now - seconds for n, (_, seconds) in lost.items()}
    if m.state == S.RUNNING:
        state = m.open_round(faults, now, out, lost=fault_at)
        _record_losses(m, lost, out)
        return state
    r = m.round
    assert r is not None  # every ACTIVE state but RUNNING has a round open
    r.faults.update(faults)
    r.lost = {**r.lost, **{n: fault_at[n] for n in nodes if n not in r.lost}}
    r.participants = r.participants - set(nodes)  # replaced, never changed in place (checkpoint.py)
    r.statuses = set()
    _record_losses(m, lost, out)
    m.record(out, "round_faults", faults=fmt_faults(r.faults))
    return m.broadcast_stop(now, out)  # the survivors hear the whole fault set again


def _record_losses(m: Job, lost: dict[int, tuple[AgentInfo, float]], out: Outcome, kind: str = "node_lost") -> None:
    for n, (a, seconds) in lost.items():
        m.record(out, kind, node_rank=n, host=a.host, pid=a.pid, seconds=round(seconds, 3),
                 grace=a.loss_after, rejoin_timeout=m.config.node_rejoin_timeout)


def replace_holder(m: Job, a: AgentInfo, ev: AgentRegistered, now: float, out: Outcome) -> None:
    """The Register of a replacement for awaited node `a.node_rank`: the caller becomes its holder. The fence
    of the lost identity stays and now names its successor, in the same stored change."""
    n = a.node_rank
    old = (a.host, a.pid)
    for key, fence in list(m.fences.items()):
        if key[0] == n and not fence.by_pid and not fence.by_host:
            m.fences[key] = replace(fence, by_host=ev.host, by_pid=ev.pid, replaced_at=now, standby=ev.standby)
    a.registered_at = now
    m.record(out, "node_replaced", node_rank=n, old_host=old[0], old_pid=old[1], host=ev.host, pid=ev.pid,
             standby=ev.standby)
    out.info = (f"registered as the replacement of node {n} (its agent {old[0]}:{old[1]} was lost); wait for "
                "the round's changeStrategy before starting any rank")


def rejoined(m: Job, ev: AgentConnected, now: float, out: Outcome) -> None:
    """The replacement of an awaited node opened its stream: the node is no longer awaited."""
    if ev.node_rank in m.rejoining and any(k[0] == ev.node_rank and f.by_pid == m.agents[ev.node_rank].pid
                                           for k, f in m.fences.items()):
        since = m.rejoining.pop(ev.node_rank)
        m.record(out, "node_rejoined", node_rank=ev.node_rank, seconds_since_loss=round(now - since, 3))


def on_rejoin_timeout(m: Job, ev: RejoinDue, now: float, out: Outcome, scale_in: str = "") -> JobState:
    """No replacement registered (and subscribed) within `node_rejoin_timeout` of the loss: the job cannot
    get its ranks back, so it fails, and the survivors are told to exit with how to add a node. `scale_in`: why
    an opted-in job could not go on with fewer nodes instead (taskd.controller.nodes.resize, which calls this)."""
    deadline = m.rejoin_deadline
    if deadline is None or now < deadline:
        return m.state
    nodes = sorted(m.rejoining)
    timeout = m.config.node_rejoin_timeout
    m.record(out, "rejoin_timeout", nodes=nodes, timeout=timeout, **({"scale_in": scale_in} if scale_in else {}))
    how = "; ".join(HOW_TO_ADD.format(node=n) for n in nodes)
    info = (f"node(s) {_nodes(nodes)} lost and no replacement joined within {timeout:g} s "
            f"(--node-rejoin-timeout): to add a node, {how}"
            + (f" (it could not go on without {'it' if len(nodes) == 1 else 'them'}: {scale_in})" if scale_in else ""))
    m.rejoining.clear()
    return m.fail(info, now, out, notify=any(not a.finished for a in m.agents.values()))


def fence_refusal(m: Job, event: Event, now: float) -> str:
    """Why `event` comes from a fenced identity ("" if it does not): an agent the controller declared lost
    whose node another agent holds, or is awaited. In every state, a finished job's too: a fenced agent that
    comes back after the job ended must neither reset it (Init), nor take its node back (Register), nor end
    it again (issue 31, F1). Clients that send no pid are never fenced (nothing tells one from another)."""
    pid = getattr(event, "pid", 0)
    if not pid:
        return ""
    n = getattr(event, "node_rank", 0)
    fence = m.fences.get((n, getattr(event, "host", ""), pid))
    return fence_info(m, fence, now) if fence is not None else ""


def reporter_refusal(m: Job, event: Event) -> str:
    """Why `event` does not come from the agent registered for its node ("" if it does): a report must come
    from the process that holds the node, or one node's agent could finish, or recover, another's. Clients
    that send no pid (ClusterD's) are not checked, as for fencing."""
    pid = getattr(event, "pid", 0)
    if not pid or m.state in TERMINAL:
        return ""
    move = m.node_move  # a node migration's successor reports its stages while still a standby
    if isinstance(event, MigrationReported) and move is not None and (event.host, pid) == move.standby:
        return ""
    n = getattr(event, "node_rank", 0)
    a = m.agents.get(n)
    host = getattr(event, "host", "")
    if a is None or not a.pid or (a.host, a.pid) == (host, pid):
        return ""
    return (f"node {n} of job {m.job_id} is held by {a.host[:64]}:{a.pid}, not by {host[:64]}:{pid}: a report "
            "comes from the node's registered agent (Register as that node first)")


def fence_info(m: Job, fence: Fence, now: float) -> str:
    held = (f"is now held by {fence.by_host}:{fence.by_pid}" + (" (a standby agent)" if fence.standby else "")
            if fence.by_pid or fence.by_host else f"the job is {m.state.value}" if m.state in TERMINAL
            else "awaits a replacement")
    return (f"node {fence.node_rank} of job {m.job_id} was declared lost {now - fence.lost_at:.0f}s ago (its agent "
            f"{fence.host}:{fence.pid}, this process) and {held}: this agent must stop its ranks and exit")
