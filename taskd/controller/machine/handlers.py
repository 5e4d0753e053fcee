"""The handlers the transition table (`taskd.controller.machine.table`) names: one per (states, event) rule.

A handler gets the job, the event, the time and the `Outcome` to fill, and returns the job's next
state (checked against its rule's targets), or `DECLINED` when a duplicate-only rule is given
something that is not a duplicate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from taskd.controller.machine import resumed
from taskd.controller.machine.agents import AgentInfo
from taskd.controller.machine.events import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    FaultReported,
    JobInit,
    JoinDue,
    Outcome,
    Record,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
    Tick,
)
from taskd.controller.machine.job import Job, rerun_refusal
from taskd.controller.machine.model import DECLINED, LIVE, TERMINAL, Declined, JobState, fmt_faults, loss_clock
from taskd.controller.machine.strategy import IN_PLACE
from taskd.controller.nodes import node_loss, node_migration, standby
from taskd.vocabulary import Code, FaultRanks, SignalType, Strategy

S = JobState
Result = JobState | Declined

ROUND_BEFORE_DECISION = frozenset({S.STOPPING, S.COLLECTING, S.REJOINING, S.RESUMING})
"""A round not yet decided (or re-run after a controller restart): a node finishing then dooms it."""

# ---------------------------------------------------------------------------- job and agent lifecycle


def on_init(m: Job, ev: JobInit, now: float, out: Outcome) -> Result:
    """Init resets a finished job, or one nobody is connected to and the caller is unknown (not a replacement
    the job awaits); else joins.

    A caller that is one of the job's agents (same host and pid) is that agent process reconnecting,
    never a new run: it joins. An agent of a failed job that never finished (e.g. declared lost) then
    learns from its subscription that the job failed (killMaster); one that finished, re-Initing as its
    client closes (1 ms after its own finish report), must not reset the finished job to RUNNING."""
    callers = m.agents.at(ev.host, ev.pid) if ev.pid != 0 else []
    known = bool(callers) or ev.standby  # a standby never resets a job: it waits for the job's own run
    # the replacement of a node an open node-loss round awaits joins it, even while no survivor is connected
    # (after a controller restart, before they resubscribe): a reset would abandon the round
    known = known or (ev.node_rank in m.rejoining and m.state in LIVE and not ev.standby)
    # a job another node's Init created a moment ago, no agent registered yet: the nodes of one start race to
    # Init, and a reset would only record a "job_reset" of a run that has not begun (same shape: nothing to redo)
    known = known or (_unstarted(m) and _same_shape(m, ev))
    online = m.agents.online_count > 0
    if not known and (why := rerun_refusal(m, ev.node_rank, ev.standby)):
        out.code, out.info = Code.INVALID_PARAMS, why  # the failed job stays as it ended (docs/controller.md)
        m.record(out, "rerun_refused", node_rank=ev.node_rank, host=ev.host, pid=ev.pid)
        return m.state
    if (m.state in TERMINAL and not known) or (not online and not known):
        reason = f"job was {m.state.value}" if m.state in TERMINAL else "no agent of the job is connected"
        if m.round is not None and m.state not in TERMINAL:
            m.close_round("abandoned", now, out)
        out.agents_changed.update(m.agents)
        m.reset(ev)
        m.record(out, "job_reset", reason=reason, node_count=m.node_count, max_restarts=m.max_restarts,
                 policy=list(m.policy))
        out.info = f"job {m.job_id} reset ({reason})"
        return S.RUNNING
    if why := _per_node_refusal(m, ev.node_rank, ev.ranks_per_node, ev.standby):
        out.code, out.info = Code.INVALID_PARAMS, why  # joins nothing: the job is as it was
        return m.state
    m.record(out, "job_joined", node_rank=ev.node_rank, host=ev.host, pid=ev.pid)
    out.info = f"joined job {m.job_id} ({m.state.value})"
    return m.state


def _unstarted(m: Job) -> bool:
    """Created by an Init and nothing since: no agent registered, no round, no restart, no fence."""
    return (m.state is S.RUNNING and len(m.agents) == 0 and m.round is None and m.restarts == 0
            and not m.fences and not m.queued)


def _same_shape(m: Job, ev: JobInit) -> bool:
    """The Init asks for the job as it is (nodes, ranks per node, budget, policy, minimum size)."""
    budget = ev.max_restarts if ev.max_restarts is not None else m.config.default_max_restarts
    return ((ev.node_count if ev.node_count > 0 else 1) == m.node_count and ev.ranks_per_node == m.ranks_per_node
            and budget == m.max_restarts and tuple(ev.strategies) == m.policy and ev.min_nodes == m.min_nodes)


def _per_node_refusal(m: Job, node_rank: int, given: int, standby: bool) -> str:
    """Why a node (or standby) may not join with `given` ranks per node ("" if it may): every node of a job runs
    as many ranks, so a node's ranks are node_rank * ranksPerNode onwards; one that said otherwise would claim
    another node's ranks (and report their faults). Checked against the job's Init, else against a node already
    registered; 0 (ClusterD's wire: not said) is never refused."""
    if given <= 0:
        return ""
    expected, source = m.ranks_per_node, "its Init"
    if expected <= 0:
        known = [(n, a.ranks_per_node) for n, a in sorted(m.agents.items())
                 if a.ranks_per_node > 0 and (n != node_rank or standby)]
        if not known:
            return ""
        expected, source = known[0][1], f"node {known[0][0]} registered with it"
    if given == expected:
        return ""
    node = "a standby" if standby else f"node {node_rank}"
    return (f"{node} says it runs {given} rank(s) per node, but job {m.job_id} has {expected} ({source}): every "
            "node of a job runs as many ranks (`taskd run --nproc-per-node`), else its ranks overlap another node's. "
            f"Start it with --nproc-per-node {expected}, or start the job afresh under another job id")


def on_register(m: Job, ev: AgentRegistered, now: float, out: Outcome) -> Result:
    if why := _per_node_refusal(m, ev.node_rank, ev.ranks_per_node, ev.standby):
        out.code, out.info = Code.INVALID_PARAMS, why  # the node keeps what it had: its ranks, its agent
        return m.state
    if ev.standby:
        return standby.on_register(m, ev, now, out)
    if ev.node_rank >= m.node_count:
        out.code = Code.INVALID_PARAMS
        out.info = f"nodeRank {ev.node_rank} out of range: job {m.job_id} has nodeCount {m.node_count}"
        return m.state
    moved = node_migration.take(m, ev.node_rank, ev.host, ev.pid, now, out)  # a node migration's successor
    if not moved and (why := m.holder_refusal(ev.node_rank, ev.host, ev.pid, now)):
        out.code = Code.INVALID_PARAMS  # the live agent keeps its node, its signals and its loss clock
        out.info = why
        return m.state
    table = m.agents
    a = table.get(ev.node_rank)
    if a is None:
        a = AgentInfo(node_rank=ev.node_rank, registered_at=now)
        table.add(a)
        if m.first_registered_at is None:
            m.first_registered_at = now  # the join timeout counts from here
    elif (ev.node_rank in m.rejoining or ev.node_rank in m.absent) and m.state in LIVE \
            and (a.host, a.pid) != (ev.host, ev.pid):  # a lost node's replacement, or a node a downgrade left out
        was_standby = standby.take(m, ev, out) is not None  # the node it was assigned: the hand-over
        if not was_standby:  # a replacement came first: the standby assigned this node is free for the next
            standby.unassign(m, ev.node_rank)
        node_loss.replace_holder(m, a, replace(ev, standby=ev.standby or was_standby), now, out)
    a.role, a.ranks_per_node, a.last_seen = ev.role, ev.ranks_per_node, now
    table.set_identity(a, ev.host, ev.pid)
    table.set_online(a, True)
    if not a.subscribed and not a.finished and a.gone_since is None and m.state in LIVE:
        # no signal stream yet: one that never comes is as lost as one that closed
        table.set_gone(a, now, loss_clock(m.config, "silent"))
    out.agents_changed.add(ev.node_rank)
    m.record(out, "agent_registered", node_rank=ev.node_rank, role=ev.role, host=ev.host, pid=ev.pid)
    if ev.restarts_used > m.restarts:  # restarts its agent made alone (degraded: no controller) count for the job
        m.record(out, "restarts_reported", node_rank=ev.node_rank, restarts=ev.restarts_used, counted=m.restarts)
        m.restarts = ev.restarts_used
    return m.state


def on_connected(m: Job, ev: AgentConnected, now: float, out: Outcome) -> Result:
    a = m.agents[ev.node_rank]
    m.agents.set_subscribed(a, True)
    m.agents.set_gone(a, None)
    out.agents_changed.add(ev.node_rank)
    m.record(out, "agent_subscribed", node_rank=ev.node_rank)
    node_loss.rejoined(m, ev, now, out)
    owed = m.owed_signal(ev.node_rank)
    if owed is not None:
        out.direct.append(owed)
    return m.state


def on_connected_rejoining(m: Job, ev: AgentConnected, now: float, out: Outcome) -> Result:
    """REJOINING: the survivors have offered their strategies; once the last awaited replacement subscribed,
    the round decides and every agent, the replacements included, gets its changeStrategy."""
    on_connected(m, ev, now, out)
    if not m.rejoining:
        return m.decide(now, out)
    return S.REJOINING


def on_connected_failed(m: Job, ev: AgentConnected, now: float, out: Outcome) -> Result:
    """An agent back on a failed job (e.g. declared lost meanwhile) must stop its ranks and exit non-zero."""
    on_connected(m, ev, now, out)
    if not m.agents[ev.node_rank].finished:
        out.direct.append(m.signal(SignalType.KILL_MASTER, (), reason=m.info))
        m.record(out, "kill_master", node_rank=ev.node_rank, reason=m.info)
    return S.FAILED


def on_connected_resuming(m: Job, ev: AgentConnected, now: float, out: Outcome) -> Result:
    on_connected(m, ev, now, out)
    if m.agents.subscribed_count >= m.node_count - len(m.absent) - len(m.rejoining):  # every expected node is back
        return resume_round(m, "every agent resubscribed", now, out)
    return S.RESUMING


def resume_round(m: Job, why: str, now: float, out: Outcome) -> JobState:
    """Restart the round a controller restart interrupted: stopTrain again, with what queued meanwhile."""
    r = m.round
    assert r is not None
    r.faults.update(m.queued)
    m.queued.clear()
    r.strategy = ""
    r.statuses = set()
    r.participants = m.expected_nodes() - set(m.rejoining)
    m.record(out, "round_resumed", reason=why, faults=fmt_faults(r.faults))
    return m.broadcast_stop(now, out)


def on_disconnected(m: Job, ev: AgentDisconnected, now: float, out: Outcome) -> Result:
    a = m.agents.get(ev.node_rank)
    if a is not None and a.subscribed:
        m.agents.set_subscribed(a, False)
        m.agents.set_online(a, False)
        out.agents_changed.add(ev.node_rank)
        m.record(out, "agent_unsubscribed", node_rank=ev.node_rank)
    return m.state


def on_disconnected_live(m: Job, ev: AgentDisconnected, now: float, out: Outcome) -> Result:
    """Start the agent's loss clock: unless it resubscribes or finishes in time, the job fails."""
    a = m.agents.get(ev.node_rank)
    if a is not None and a.subscribed and not a.finished and not node_migration.old_agent_left(m, ev.node_rank):
        m.agents.set_gone(a, now, loss_clock(m.config, "ended"))
    return on_disconnected(m, ev, now, out)


def on_join_timeout(m: Job, ev: JoinDue, now: float, out: Outcome) -> Result:
    """Nodes that never registered within the join timeout of the first agent: the job cannot run without
    them (torchrun's rendezvous gives up after its join_timeout too), so it fails and the agents that joined
    are told to exit, as when an agent is lost."""
    deadline = m.join_deadline
    if deadline is None or now < deadline:
        return m.state  # every node registered meanwhile, or the job was reset
    missing = m.missing_nodes()
    timeout = m.config.join_timeout
    m.record(out, "join_timeout", missing=missing, joined=len(m.agents), node_count=m.node_count, timeout=timeout)
    shown = f"[{', '.join(map(str, missing[:20]))}{', ...' if len(missing) > 20 else ''}]"
    more = f" ({len(missing)} of {m.node_count})" if len(missing) > 20 else ""
    info = f"node(s) {shown}{more} never joined within {timeout:g} s"
    others = any(not a.finished for a in m.agents.values())
    return m.fail(info, now, out, notify=others)


def on_finished(m: Job, ev: AgentFinished, now: float, out: Outcome) -> Result:
    m.agents.finish(m.agents[ev.node_rank], ev.exit_code)
    out.agents_changed.add(ev.node_rank)
    m.record(out, "agent_finished", node_rank=ev.node_rank, exit_code=ev.exit_code, message=ev.message)
    if m.state in TERMINAL:
        return m.state
    if ev.exit_code != 0:
        return m.fail(f"node {ev.node_rank} finished with exit code {ev.exit_code}: {ev.message}".rstrip(": "),
                      now, out)
    if m.agents.finished_ok_count >= m.node_count - len(m.absent):  # every present node finished with exit code 0
        if m.round is not None:
            m.close_round("finished", now, out)
            m.round = None
        m.deadline = None
        m.queued.clear()
        m.info = "every agent finished with exit code 0"
        m.record(out, "job_succeeded", info=m.info)
        return S.SUCCEEDED
    r = m.round
    own = node_loss.node_ranks(m, m.agents[ev.node_rank])  # empty when no Init said how many ranks a node has
    if r is not None and m.state in ROUND_BEFORE_DECISION and own and not set(r.faults) & set(own):
        # issue 21, D3 across nodes: this node's ranks ended and its agent leaves; the round's fault ranks can only
        # come back among ranks that are gone (a replacement would wait for them in its first collective), and
        # this node will answer nothing (the stop timeout, then a restart that hangs): end the job now
        ranks = ", ".join(map(str, sorted(r.faults)))
        return m.fail(f"node(s) {ev.node_rank} finished while round {r.number} was open for rank(s) {ranks}: "
                      "no recovery without them", now, out)
    return m.state


# ---------------------------------------------------------------------------- faults


def _fault_record(m: Job, out: Outcome, ev: FaultReported, faults: FaultRanks, action: str,
                  round_number: int | None = None) -> None:
    detail = {"node_rank": ev.node_rank, "faults": fmt_faults(faults), "detail": ev.detail, "action": action}
    out.records.append(Record("fault_reported", m.round_number if round_number is None else round_number, detail))


def on_fault_running(m: Job, ev: FaultReported, now: float, out: Outcome) -> Result:
    faults = dict(m.queued)
    faults.update(ev.faults)
    m.queued.clear()
    _fault_record(m, out, ev, ev.faults, "opened", round_number=m.round_counter + 1)
    if m.agents.finished_ok_count:
        # Nodes whose ranks all ended 0 have left: a restarted rank would wait for them in its first
        # collective forever. Failing now beats a stop timeout followed by a recovery that hangs.
        ranks = ", ".join(map(str, sorted(faults)))
        done = ", ".join(str(n) for n, a in sorted(m.agents.items()) if a.finished_ok)
        return m.fail(f"rank(s) {ranks} failed after node(s) {done} had finished: no recovery without them", now, out)
    return m.open_round(faults, now, out)


def on_fault_merge(m: Job, ev: FaultReported, now: float, out: Outcome) -> Result:
    r = m.round
    assert r is not None
    new = {k: v for k, v in ev.faults.items() if r.faults.get(k) != v}
    if not new:
        out.info = f"already in round {r.number}"
        return m.state
    r.faults.update(new)
    _fault_record(m, out, ev, new, "merged")
    m.record(out, "round_faults", faults=fmt_faults(r.faults))
    if m.state == S.RESUMING:
        return S.RESUMING
    return m.broadcast_stop(now, out)


def on_fault_queue(m: Job, ev: FaultReported, now: float, out: Outcome) -> Result:
    """Queued for the next round; but a node's reports come in order, so one made before its job-rescheduling
    status names ranks that job-rescheduling restarts: it joins the round (a next round would recover them)."""
    r = m.round
    if r is not None and r.strategy == Strategy.JOB_RESCHEDULING and ev.node_rank not in r.statuses:
        r.faults.update(ev.faults)
        _fault_record(m, out, ev, ev.faults, "merged")
        m.record(out, "round_faults", faults=fmt_faults(r.faults))
        out.info = f"joined round {r.number}: its job-rescheduling restarts them"
        return m.state
    new = {k: v for k, v in ev.faults.items() if m.queued.get(k) != v}
    if not new:
        out.info = "already queued"
        return m.state
    m.queued.update(new)
    _fault_record(m, out, ev, new, "queued")
    out.info = f"queued for the round after round {m.round_number}"
    return m.state


def on_fault_terminal(m: Job, ev: FaultReported, now: float, out: Outcome) -> Result:
    out.code = Code.OUT_OF_ORDER
    out.info = f"job {m.job_id} is {m.state.value}, not RUNNING: no recovery for a finished job"
    return m.state


# ---------------------------------------------------------------------------- the round's answers


def on_stop_complete(m: Job, ev: StopComplete, now: float, out: Outcome) -> Result:
    r = m.round
    assert r is not None
    reported = frozenset(ev.faults)
    if reported and reported != r.broadcast_sets[-1] and reported in r.broadcast_sets[:-1]:
        m.record(out, "stop_complete_stale", node_rank=ev.node_rank, faults=fmt_faults(ev.faults))
        out.info = "acknowledges an earlier stopTrain; waiting for the one with the merged fault set"
        return S.STOPPING
    m.record(out, "stop_complete", node_rank=ev.node_rank, code=ev.code, info=ev.info)
    if ev.code != Code.OK:
        why = f"node {ev.node_rank} could not stop its ranks ({ev.code}: {ev.info})"
        for s in IN_PLACE:
            r.excluded.setdefault(s, why)
    r.acks.add(ev.node_rank)
    if r.participants <= r.acks:
        return m.to_collecting(now, out)
    return S.STOPPING


def on_repeated_stop_complete(m: Job, ev: StopComplete, now: float, out: Outcome) -> Result:
    """A duplicate of an answer already counted (a client retry) is fine; anything else is out of order."""
    if m.round is not None and ev.node_rank in m.round.acks and ev.code == Code.OK:
        out.info = f"already counted; job {m.job_id} is {m.state.value}"
        return m.state
    return DECLINED


def on_strategies(m: Job, ev: StrategiesReported, now: float, out: Outcome) -> Result:
    r = m.round
    assert r is not None
    r.reports[ev.node_rank] = tuple(ev.strategies)
    m.record(out, "strategies_reported", node_rank=ev.node_rank, strategies=list(ev.strategies))
    if r.participants <= r.reports.keys():  # no set built per report: 10,000 reports made that O(N^2)
        return m.decide_or_wait(now, out)
    return S.COLLECTING


def on_repeated_strategies(m: Job, ev: StrategiesReported, now: float, out: Outcome) -> Result:
    """The same list again from an agent already counted is fine; anything else is out of order."""
    if m.round is not None and m.round.reports.get(ev.node_rank) == tuple(ev.strategies):
        out.info = f"already counted; job {m.job_id} is {m.state.value}"
        return m.state
    return DECLINED


def on_recover_status(m: Job, ev: RecoverStatusReported, now: float, out: Outcome) -> Result:
    r = m.round
    assert r is not None
    if ev.strategy and ev.strategy != r.strategy:
        out.code = Code.OUT_OF_ORDER
        out.info = f"job {m.job_id} is carrying out {r.strategy}, not {ev.strategy}"
        return m.state
    m.record(out, "recover_status", node_rank=ev.node_rank, code=ev.code, info=ev.info, strategy=r.strategy,
             isolate=list(ev.isolate_ranks))
    if ev.code != Code.OK:
        return m.strategy_failed(f"node {ev.node_rank} reported {ev.code}: {ev.info}", now, out)
    r.statuses.add(ev.node_rank)
    if not ev.rejoined:
        r.unrejoined = True
    if not r.participants <= r.statuses:
        return S.RECOVERING
    if r.strategy == Strategy.DUMP:
        m.close_round("dumped", now, out)
        m.info = f"dumped after round {r.number} (faults {fmt_faults(r.faults)})"
        m.record(out, "job_failed", info=m.info)
        m.deadline = None
        m.queued.clear()
        return S.FAILED
    m.close_round("recovered", now, out)
    resumed.round_recovered(m, r, out)  # its nodes say next when their ranks train again
    m.record(out, "recovered", strategy=r.strategy, duration=round(now - r.started_at, 6))
    if r.strategy == Strategy.RECOVER:
        m.recover_succeeded_at = now
        m.recover_ranks = frozenset(r.faults)
        m.recover_rejoined = not r.unrejoined
    # not "recovered" yet: training resumes after this, as the agents then say (controller/machine/resumed.py)
    m.info = f"round {r.number} ended with {r.strategy} {now - r.started_at:.2f}s after its fault"
    m.round = None
    m.deadline = None
    if m.queued:
        faults, m.queued = m.queued, {}
        return m.open_round(faults, now, out)
    return S.RUNNING


def on_late_status(m: Job, ev: RecoverStatusReported, now: float, out: Outcome) -> Result:
    """An agent confirming the exit/dump that ended the job."""
    r = m.round
    if r is None or (ev.strategy and ev.strategy != r.strategy):
        out.code = Code.OUT_OF_ORDER
        current = r.strategy if r else "nothing"
        out.info = f"job {m.job_id} is {m.state.value} after {current}, not carrying out {ev.strategy or 'a strategy'}"
        return m.state
    m.record(out, "recover_status", node_rank=ev.node_rank, code=ev.code, info=ev.info, strategy=r.strategy,
             isolate=list(ev.isolate_ranks))
    return m.state


# ---------------------------------------------------------------------------- deadlines


def _due(m: Job, now: float) -> bool:
    return m.deadline is not None and now >= m.deadline


def _missing(m: Job, answered: Iterable[int]) -> list[int]:
    assert m.round is not None
    return sorted(m.round.participants - set(answered))


def _drop_silent(m: Job, answered: Iterable[int], kind: str, why: str, out: Outcome) -> None:
    """A stop or strategy timeout: the round goes on without the agents that did not answer, and
    excludes the in-place strategies, since it no longer knows the state of those nodes."""
    r = m.round
    assert r is not None
    missing = _missing(m, answered)
    m.record(out, kind, missing=missing)
    r.participants = r.participants - set(missing)  # replaced, never changed in place (checkpoint.py)
    for s in IN_PLACE:
        r.excluded.setdefault(s, why.format(missing=missing))


def on_tick_stopping(m: Job, ev: Tick, now: float, out: Outcome) -> Result:
    if not _due(m, now):
        return m.state
    assert m.round is not None
    _drop_silent(m, m.round.acks, "stop_timeout", "stop timeout: node(s) {missing} did not confirm", out)
    return m.to_collecting(now, out)


def on_tick_collecting(m: Job, ev: Tick, now: float, out: Outcome) -> Result:
    if not _due(m, now):
        return m.state
    assert m.round is not None
    _drop_silent(m, m.round.reports, "collect_timeout", "strategy timeout: node(s) {missing} did not report", out)
    return m.decide_or_wait(now, out)


def on_tick_recovering(m: Job, ev: Tick, now: float, out: Outcome) -> Result:
    if not _due(m, now):
        return m.state
    r = m.round
    assert r is not None
    missing = _missing(m, r.statuses)
    m.record(out, "recover_timeout", strategy=r.strategy, missing=missing)
    return m.strategy_failed(f"timed out waiting for node(s) {missing}", now, out)


def on_tick_resuming(m: Job, ev: Tick, now: float, out: Outcome) -> Result:
    if not _due(m, now):
        return m.state
    back = sorted(n for n, a in m.agents.items() if a.subscribed)
    return resume_round(m, f"resume timeout; agents back: {back}", now, out)
