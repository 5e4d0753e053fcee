"""Scale-in and scale-out (issue 17, item 4; ClusterD's `downgrade` and `upgrade`): opt-in, live only.

A job opts in with `taskd run --nnodes MIN:MAX` (MIN < MAX: `ClientInfo.minNodes`, `Job.min_nodes`) and ranks
that declared a resize hook (`LiveGroup(on_resize=...)`): an agent offers `downgrade` and `upgrade` in its
strategies only if every local rank did. The rules, each a pure function of the job:

- `refusal`: why a node-loss round whose replacement did not come in time cannot go on smaller ("" if it
  can): not opted in, fewer than MIN nodes left, or a survivor that did not offer `downgrade`;
- `scale_in`: the rejoin timeout passed and `refusal` is "": the awaited nodes become `Job.absent`, their
  fences stay, and every survivor gets `changeStrategy downgrade` with the new world size and the rank map
  (old global rank -> new, contiguous in node-rank then local-rank order) in its extraParams. The survivors'
  ranks keep their processes and re-form the group at the smaller size in the order's generation;
- `on_connected_running`: an agent for an absent node rank subscribed (an operator's `taskd run --node-rank R`
  or an assigned standby; its Register was the hand-over of `node_loss.replace_holder`): the job grows back
  with a round of its own, `changeStrategy upgrade` to every agent, the rank map the identity again; the new
  node starts its ranks as joiners of the order's generation and takes the state from its peers in memory.

- `start_smaller`: the job's nodes 0..MIN-1 registered `last_call_timeout` ago and some are still missing
  (`job.last_call_deadline`, torchrun's last call): the missing nodes become `Job.absent` and the job runs with
  the nodes present (their agents' join wait ends: every node is registered or absent, and each starts its ranks
  with WORLD_SIZE for the nodes present, agent/ranks/resize.py `present_nodes`);
- a node absent since the start (no fence: never lost) that subscribes later grows the job by a round of its
  own that restarts every rank at the new size (`job-rescheduling`, as torchrun restarts its workers when a node
  arrives; in-place strategies excluded, and not charged to the restart budget).

A downgrade is its node-loss round's one restart; an upgrade restarts nothing and is not charged. Each round
ends when every agent of the new size reported its status; a failed one fails the job (`Job.strategy_failed`).
docs/architecture.md, "Scale-in and scale-out", has the wire.
"""

from __future__ import annotations

from taskd.controller.machine import handlers
from taskd.controller.machine.events import AgentConnected, LastCallDue, Outcome, RecoverStatusReported, RejoinDue
from taskd.controller.machine.job import Job, last_call_deadline
from taskd.controller.machine.model import Declined, JobState, Round, fmt_faults
from taskd.controller.machine.strategy import IN_PLACE, RESTARTING
from taskd.controller.nodes import node_loss
from taskd.vocabulary import Action, FaultType, SignalType, Strategy

S = JobState

OPT_IN = ("run every node with `taskd run --nnodes MIN:MAX` (MIN < MAX) and pass `on_resize=` to every rank's "
          "LiveGroup to let the job go on with fewer nodes")


def refusal(m: Job) -> str:
    """Why the job cannot go on without the nodes it awaits ("" when it can: every survivor offered downgrade and
    at least `min_nodes` remain)."""
    r = m.round
    if not m.min_nodes or m.min_nodes >= m.node_count:
        return f"the job is fixed-size ({OPT_IN})"
    if r is None or not m.rejoining:
        return "no node-loss round awaits a replacement"
    left = m.node_count - len(m.absent) - len(m.rejoining)
    if left < m.min_nodes:
        return f"only {left} node(s) would remain, fewer than --nnodes MIN {m.min_nodes}"
    if m.restarts >= m.max_restarts and not any(s in RESTARTING for s in r.tried):
        return f"restart budget spent ({m.restarts}/{m.max_restarts})"
    lacking = sorted(n for n in r.participants if Strategy.DOWNGRADE not in r.reports.get(n, ()))
    if lacking:
        return (f"node(s) {', '.join(map(str, lacking))} did not offer {Strategy.DOWNGRADE} (a rank without "
                "LiveGroup(on_resize=...), or not live)")
    if m.ranks_per_node <= 0:
        return "the job's Init said no ranks per node"
    return ""


def rank_map(m: Job, absent: set[int]) -> dict[int, int]:
    """Old global rank -> new, for the nodes not in `absent`: contiguous, in node-rank then local-rank order."""
    per = m.ranks_per_node
    nodes = [n for n in range(m.node_count) if n not in absent]
    return {n * per + lr: i * per + lr for i, n in enumerate(nodes) for lr in range(per)}


def _change(m: Job, r: Round, strategy: str, absent: set[int], now: float, out: Outcome) -> JobState:
    """Tell every present agent `strategy` with the size it forms next; the round then waits for their statuses."""
    ranks = rank_map(m, absent)
    r.strategy = strategy
    r.strategy_started_at = now
    r.statuses = set()
    r.tried.append(strategy)
    r.participants = m.expected_nodes()
    world = len(ranks)
    m.record(out, "resized", strategy=strategy, nodes=sorted(r.participants), node_count=len(r.participants),
             world_size=world, absent=sorted(absent), restarts=m.restarts)
    extra = (("world_size", world), ("rank_map", {str(k): v for k, v in sorted(ranks.items())}))
    out.signals.append(m.signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), r.faults, strategy=strategy,
                                timeout=int(round(m.config.recover_timeout)), extra=extra))
    m.info = (f"round {r.number}: {strategy} to {len(r.participants)} of {m.node_count} node(s), world size {world}"
              + (f" (without node(s) {', '.join(map(str, sorted(absent)))})" if absent else ""))
    m.deadline = now + m.config.recover_timeout
    return S.RECOVERING


def on_rejoin_timeout(m: Job, ev: RejoinDue, now: float, out: Outcome) -> JobState:
    """The rejoin timeout of a node-loss round: the job goes on smaller if it may (`refusal`), else it fails
    saying how to add a node (`node_loss.on_rejoin_timeout`), and why it could not go on without it."""
    deadline = m.rejoin_deadline
    if deadline is None or now < deadline:
        return m.state
    why = refusal(m)
    if why:
        return node_loss.on_rejoin_timeout(m, ev, now, out, scale_in=why if m.min_nodes else "")
    return scale_in(m, now, out)


def scale_in(m: Job, now: float, out: Outcome) -> JobState:
    """No replacement came in time, and the job may go on smaller (`refusal` is ""): go on without those nodes.
    It is the node-loss round's one restart (unless that round already paid one)."""
    r = m.round
    assert r is not None
    if not any(s in RESTARTING for s in r.tried):
        m.restarts += 1
    nodes = sorted(m.rejoining)
    m.absent = {**m.absent, **{n: now for n in nodes}}  # replaced, never changed in place (checkpoint.py)
    m.rejoining = {}
    m.record(out, "rejoin_timeout", nodes=nodes, timeout=m.config.node_rejoin_timeout, scale_in=True)
    return _change(m, r, Strategy.DOWNGRADE, set(m.absent), now, out)


def on_connected_running(m: Job, ev: AgentConnected, now: float, out: Outcome) -> JobState:
    """RUNNING: as any agent's subscribe; an absent node's new agent grows the job back at once."""
    handlers.on_connected(m, ev, now, out)
    if ev.node_rank in m.absent and _late(m, ev.node_rank):
        return _grow_late(m, ev.node_rank, now, out)
    if ev.node_rank not in m.absent or not _replaced(m, ev.node_rank):
        return m.state
    return _grow(m, ev.node_rank, now, out)


def on_recover_status(m: Job, ev: RecoverStatusReported, now: float, out: Outcome) -> JobState | Declined:
    """As any recover status; when the round closes, an absent node's new agent that subscribed while it was open
    grows the job back now (a round at a time)."""
    state = handlers.on_recover_status(m, ev, now, out)
    if state is not S.RUNNING:
        return state
    late = [n for n in sorted(m.absent) if _late(m, n) and m.agents[n].subscribed]
    if late:
        return _grow_late(m, late[0], now, out)
    waiting = [n for n in sorted(m.absent) if _replaced(m, n) and m.agents[n].subscribed]
    return _grow(m, waiting[0], now, out) if waiting else state


def _grow(m: Job, n: int, now: float, out: Outcome) -> JobState:
    """Node `n` is back: a round of its own tells every agent to form the group at the full size again."""
    since = m.absent[n]
    m.absent = {k: t for k, t in m.absent.items() if k != n}
    m.record(out, "node_rejoined", node_rank=n, seconds_since_loss=round(now - since, 3), scale_out=True)
    faults = {rank: FaultType.PROCESS for rank in node_loss.node_ranks(m, m.agents[n])}  # its ranks start
    m.round_counter += 1
    r = Round(number=m.round_counter, started_at=now, faults=faults, participants=m.expected_nodes())
    m.round = r
    m.record(out, "round_started", faults=fmt_faults(faults), reason=f"node {n} joins: the job grows back")
    return _change(m, r, Strategy.UPGRADE, set(m.absent), now, out)


def start_smaller(m: Job, ev: LastCallDue, now: float, out: Outcome) -> JobState:
    """The last call of a `--nnodes MIN:MAX` job: it runs with the nodes present (0..K-1, K >= MIN); the others
    are absent, and each one that registers later grows the job (`_grow_late`)."""
    deadline = last_call_deadline(m)
    if deadline is None or now < deadline:
        return m.state
    present = len(m.agents)
    missing = [n for n in range(m.node_count) if n not in m.agents]
    m.absent = {n: now for n in missing}  # replaced, never changed in place (checkpoint.py)
    world = present * m.ranks_per_node
    m.record(out, "started_smaller", nodes=present, node_count=m.node_count, absent=missing, world_size=world,
             last_call_timeout=m.config.last_call_timeout)
    m.info = (f"started with {present} of {m.node_count} node(s) after the last call "
              f"({m.config.last_call_timeout:g}s, --rdzv-conf last_call_timeout); node(s) "
              f"{', '.join(map(str, missing))} grow the job when they join")
    return S.RUNNING


def _late(m: Job, n: int) -> bool:
    """Node `n` was absent from the start (`start_smaller`: never lost, so never fenced) and its agent is here."""
    return n in m.agents and not any(k[0] == n for k in m.fences)


def _grow_late(m: Job, n: int, now: float, out: Outcome) -> JobState:
    """Node `n` joins a job that started without it: every rank restarts at the new size (job-rescheduling: the
    ranks' WORLD_SIZE changes), as torchrun restarts its workers when a node arrives, uncharged like torchrun's."""
    since = m.absent[n]
    m.absent = {k: t for k, t in m.absent.items() if k != n}
    m.record(out, "node_joined_late", node_rank=n, seconds_since_start=round(now - since, 3),
             node_count=m.node_count - len(m.absent))
    faults = {rank: FaultType.PROCESS for rank in node_loss.node_ranks(m, m.agents[n])}  # its ranks start
    state = m.open_round(faults, now, out)
    r = m.round
    assert r is not None
    why = f"node {n} joins: every rank restarts at the new size"
    r.excluded.update({s: why for s in IN_PLACE})
    r.tried.append(Strategy.JOB_RESCHEDULING)  # a node arriving is not a fault: no restart charged (`charged`)
    return state


def _replaced(m: Job, n: int) -> bool:
    """Node `n`'s holder is the one that replaced its lost agent (not the lost agent itself)."""
    a = m.agents.get(n)
    return a is not None and any(k[0] == n and f.by_pid == a.pid and f.by_pid for k, f in m.fences.items())


__all__ = ["OPT_IN", "on_connected_running", "on_recover_status", "on_rejoin_timeout", "rank_map", "refusal",
           "scale_in", "start_smaller"]
