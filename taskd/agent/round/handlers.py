"""The agent's round handlers: one function per rule of agent/round/rules.py.

Each takes the machine's data, the event, the time (monotonic, passed in) and the list to append actions
to, and returns the state the node lands in; the table checks that state against the rule's targets. No
handler does I/O, reads a clock or touches a process: the actions say what the mechanics must do.
"""

from __future__ import annotations

import logging

from taskd.agent.link.orders import Order
from taskd.agent.round.events import (
    FAULT,
    STATUS,
    STOP_COMPLETE,
    AbandonRebuild,
    Action,
    AssignOrder,
    Began,
    BeganDegraded,
    BeganReplacement,
    BeginRebuild,
    ChangeOrder,
    ControllerLost,
    Dump,
    DumpOrder,
    Ended,
    FenceOrder,
    Finish,
    GroupFailed,
    GroupRejoined,
    JobSeen,
    KillOrder,
    LeaveGroup,
    MigrateOrder,
    Note,
    OfferStrategies,
    OrderEvent,
    PrepareReplacement,
    RankFault,
    RecordRestart,
    RejoinOverdue,
    ReportSettled,
    Resumed,
    SendReport,
    SetRestartCount,
    Signalled,
    StartJob,
    StartMigration,
    StartRanks,
    StartResult,
    StopOrder,
    StopRanks,
    StrategiesOrder,
    SuccessorGaveUp,
    SuccessorJoined,
    Supersede,
    TakeNode,
    TellResumed,
    WithdrawReports,
)
from taskd.agent.round.states import NodeRound, NodeState, RestartPlan
from taskd.vocabulary import Code, FaultRanks, FaultType, Strategy

S = NodeState
Out = list[Action]
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


# ------------------------------------------------------------------------------------------------ rank faults

def _leave_if_broken(m: NodeRound, faults: FaultRanks, out: Out) -> None:
    """A gone rank breaks a live group: the local ranks leave it at once (a type-"0" fault keeps it: retry)."""
    if m.facts.live and any(kind != FaultType.RECOVERABLE for kind in faults.values()):
        out.append(LeaveGroup())


def on_fault(m: NodeRound, ev: RankFault, now: float, out: Out) -> NodeState:
    """Report it (or add it to the report still pending): the controller opens or joins a round. A live rank that
    is gone gets its replacement prepared meanwhile (only if it could be recovered in place: agent/ranks/live.py)."""
    faults = {ev.global_rank: ev.fault_type}
    m.add_faults(faults, now - ev.unseen)  # a hang counts from its last heartbeat, not from its detection
    _leave_if_broken(m, faults, out)
    if m.facts.live and ev.fault_type != FaultType.RECOVERABLE:
        # before the report: the replacement's script is the longer path (its model built while the round runs)
        out.append(PrepareReplacement(ev.local_rank, faults))
    out.append(SendReport(FAULT, faults, ev.detail))
    return S.REPORTING


def on_fault_rebuilding(m: NodeRound, ev: RankFault, now: float, out: Out) -> NodeState:
    """A rank that ends while its group re-forms fails that recover (the rebuild's check reports it). Except a
    survivor that ended itself left blocked in its broken group (worker/torch_stuck.py): its state is its peers',
    so it starts again into the generation being formed, as a replacement does (once per rank and rebuild)."""
    faults = {ev.global_rank: ev.fault_type}
    m.add_faults(faults, now - ev.unseen)
    plan = m.plan
    if ev.stuck and plan is not None and plan.strategy in Strategy.REJOIN \
            and ev.local_rank not in plan.restarted:
        plan.restarted.add(ev.local_rank)
        out.append(Note(WARNING, f"rank {ev.global_rank} ended itself blocked in its broken group: started again "
                                 f"into the group being re-formed ({plan.strategy})"))
        out.append(StartRanks((ev.local_rank,)))
        return S.REBUILDING
    _leave_if_broken(m, faults, out)
    return S.REBUILDING


def on_restarted_rebuilding(m: NodeRound, ev: StartResult, now: float, out: Out) -> NodeState:
    """A stuck survivor started again into the rebuild (`on_fault_rebuilding`); not started: the rebuild fails."""
    if ev.code == 0:
        return S.REBUILDING
    out.append(LeaveGroup())
    return on_group_failed(m, GroupFailed(f"a rank ended stuck could not be started again: {ev.message}"), now, out)


def on_fault_degraded(m: NodeRound, ev: RankFault, now: float, out: Out) -> NodeState:
    m.add_faults({ev.global_rank: ev.fault_type}, now - ev.unseen)
    return local_restart(m, now, out)


# ------------------------------------------------------------------------------------------------ the controller

def on_report_settled(m: NodeRound, ev: ReportSettled, now: float, out: Out) -> NodeState:
    """Taken: the round is the controller's now. Not taken within the controller timeout: on without it."""
    if ev.taken:
        return S.STOPPING if m.state is S.REPORTING else m.state
    if m.degraded:
        return m.state
    return degrade(m, f"the controller did not take the fault report for {m.facts.controller_timeout:.0f}s "
                      "(unreachable or failing)", now, out)


def on_controller_lost(m: NodeRound, ev: ControllerLost, now: float, out: Out) -> NodeState:
    """The round waits on the controller's next signal, which a controller gone this long never sends."""
    return degrade(m, f"controller lost for {ev.lost_for:.0f}s in the middle of a recovery", now, out)


def degrade(m: NodeRound, why: str, now: float, out: Out) -> NodeState:
    """No controller: a single node restarts its ranks alone. A multi-node job stops instead: a node restarting
    alone would split the job, its peers keeping their old incarnation."""
    if m.facts.node_count > 1:
        out.append(Note(ERROR, f"{why}: a job of {m.facts.node_count} nodes cannot recover without its controller; "
                               "stopping every rank"))
        out.append(Finish(False, f"{why}; no recovery without the controller for a multi-node job"))
        return S.ENDED
    out.append(Note(WARNING, f"{why}: degraded mode, restarts handled locally"))
    m.budget.degraded = True
    return local_restart(m, now, out)


def local_restart(m: NodeRound, now: float, out: Out) -> NodeState:
    """Degraded: restart the whole node's ranks while the budget lasts (counted on from the controller's count)."""
    number = m.budget.spend_restart()
    if number is None:
        out.append(Finish(False, f"restart budget of {m.budget.max_restarts} spent"))
        return S.ENDED
    out.append(Note(WARNING, f"degraded: local job-rescheduling (restart {number} of {m.budget.max_restarts})"))
    started = m.started if m.started is not None else now
    m.plan = RestartPlan(Strategy.JOB_RESCHEDULING, dict(m.faults), started, degraded=True)
    _charge(m, None, out)
    out.append(Supersede(restart=True))
    if m.facts.live:
        out.append(BeginRebuild(Strategy.JOB_RESCHEDULING, dict(m.faults), started, 0.0, None))
    out.append(StartRanks(None))
    return S.RESTARTING


def _charge(m: NodeRound, order: Order | None, out: Out) -> None:
    """The job's restarts used, this round's included: the controller's count when its order carries one (it
    charges one restart per round, controller/machine/strategy.py), else one more per round counted here (ClusterD,
    degraded mode). Degraded mode's budget counts on from it."""
    if order is not None and order.restarts is not None:
        m.restarts = order.restarts
        m.charged = True
    elif not m.charged:
        m.charged = True
        m.restarts += 1
    m.budget.restarts_used = max(m.budget.restarts_used, m.restarts)
    out.append(SetRestartCount(m.restarts))


def on_stop(m: NodeRound, ev: StopOrder, now: float, out: Out) -> NodeState:
    """stopTrain: stop this node's fault ranks (a live rank paused in place stays), then say so."""
    faults = ev.order.fault_ranks
    m.add_faults(faults, now - (ev.order.fault_ago or 0.0), keep_known=True)  # a lost node: from its fault
    out.append(Supersede(restart=False))
    _leave_if_broken(m, faults, out)  # a rank of another node is gone: ours learn it from us, not the ring
    stop = [lr for lr in m.view.local_of(faults) if not m.view.live_fault(lr, faults)]
    out.append(StopRanks(tuple(stop), graceful=False))
    out.append(WithdrawReports())  # strategies and statuses this stop made moot
    out.append(SendReport(STOP_COMPLETE, faults))
    return m.state if m.state in (S.DEGRADED, S.REJOINING) else S.STOPPING


def on_strategies(m: NodeRound, ev: StrategiesOrder, now: float, out: Out) -> NodeState:
    out.append(OfferStrategies(ev.order.fault_ranks, dict(m.faults) | ev.order.fault_ranks))
    return m.state


def on_change(m: NodeRound, ev: ChangeOrder, now: float, out: Out) -> NodeState:
    """Carry out the controller's strategy: restart (recover, job-rescheduling, a live retry), dump, exit."""
    order = ev.order
    strategy = order.strategy
    faults = order.fault_ranks or dict(m.faults)
    out.append(Note(INFO, f"strategy: {strategy} for rank(s) {sorted(faults)}"))
    if strategy in (Strategy.RECOVER, Strategy.JOB_RESCHEDULING) or (strategy == Strategy.RETRY and m.facts.live) \
            or (strategy in Strategy.RESIZE and m.facts.live and order.resize is not None):
        return _restart(m, order, faults, now, out)
    if strategy == Strategy.DUMP:
        out.append(Dump(faults, order.timeout))
        return S.ENDED
    if strategy == Strategy.EXIT:
        why = order.reason()
        if why:
            out.append(Note(WARNING, f"the controller ends the job: {why}"))
        out.append(StopRanks(None, graceful=True))
        out.append(SendReport(STATUS, faults, "", Code.OK, strategy))
        out.append(Finish(False, f"the controller chose exit{': ' + why if why else ''}"))
        return S.ENDED
    out.append(Note(WARNING, f"strategy {strategy!r} is not one this agent carries out"))
    out.append(SendReport(STATUS, faults, f"unsupported strategy {strategy}", Code.RETRY_FAILED_UNRECOVERABLE,
                          strategy))
    return m.state


def _restart(m: NodeRound, order: Order, faults: FaultRanks, now: float, out: Out) -> NodeState:
    """recover: the faulty local ranks; job-rescheduling: every rank; retry (live): none, the paused ranks redo
    their step. With live recovery the generation is named first; a recover or retry is reported once the
    group has re-formed."""
    strategy = order.strategy
    started = m.started if m.started is not None else now
    if strategy != Strategy.RETRY:
        _charge(m, order, out)
    out.append(Supersede(restart=True))
    m.plan = RestartPlan(strategy, dict(faults), started, round=order.round)
    if m.facts.live:
        out.append(BeginRebuild(strategy, dict(faults), started, order.timeout, order.generation, order.resize))
    if strategy == Strategy.RETRY:
        return S.REBUILDING
    if strategy in Strategy.REJOIN:  # a resize starts only a joining node's ranks
        out.append(StartRanks(tuple(lr for lr in m.view.local_of(faults) if not m.view.live_fault(lr, faults))))
    else:
        out.append(StartRanks(None))
    return S.RESTARTING


def on_dump(m: NodeRound, ev: DumpOrder, now: float, out: Out) -> NodeState:
    out.append(Dump(ev.order.fault_ranks or dict(m.faults), ev.order.timeout))
    return S.ENDED


def on_kill(m: NodeRound, ev: KillOrder, now: float, out: Out) -> NodeState:
    order = ev.order
    why = order.reason()
    out.append(Note(WARNING, f"controller sent {order.signal_type or list(order.actions)}"
                             f"{f' ({why})' if why else ''}: stopping every rank"))
    out.append(Finish(False, f"controller sent {order.signal_type}{': ' + why if why else ''}"))
    return S.ENDED


def on_standby_end(m: NodeRound, ev: OrderEvent, now: float, out: Out) -> NodeState:
    """A standby the job never needed: the job's end (killMaster, changeStrategy exit) ends it, with 0."""
    if isinstance(ev, ChangeOrder) and ev.order.strategy != Strategy.EXIT:
        out.append(Note(INFO, f"standby: {ev.order.strategy} is not for a node that holds no rank"))
        return m.state
    return _not_needed(ev.order.reason() or ev.order.signal_type, out)


def _not_needed(detail: str, out: Out) -> NodeState:
    out.append(Note(INFO, f"standby not needed: {detail}"))
    out.append(Finish(True, f"standby, not needed ({detail})", exit_code=0))
    return S.ENDED


def on_fence(m: NodeRound, ev: FenceOrder, now: float, out: Out) -> NodeState:
    """Declared lost, and the node is held by another agent: this one must never act as it again."""
    why = ev.order.reason() or "this agent was declared lost and its node is held by another"
    out.append(Note(ERROR, f"fenced by the controller: {why}; stopping every rank"))
    out.append(StopRanks(None, graceful=False))  # its ranks must not rejoin the old generation
    out.append(Finish(False, f"fenced: {why}", exit_code=1))
    return S.FENCED


def on_assign(m: NodeRound, ev: AssignOrder, now: float, out: Out) -> NodeState:
    """A standby takes over a lost node's rank: what came of it (began as a replacement, or ended) is the next
    event; another agent that took the node first leaves it a standby."""
    node_rank = ev.order.node_rank
    if node_rank is None:
        out.append(Note(WARNING, f"taskd.assignNode {ev.order.uuid} names no node rank (extraParams "
                                 f"{ev.order.extra_params!r}): ignored"))
    else:
        out.append(TakeNode(node_rank))
    return m.state


def on_migrate(m: NodeRound, ev: MigrateOrder, now: float, out: Out) -> NodeState:
    """No round here: the migration runs beside the machine (agent/ranks/migration.py polls it); a fault ends it."""
    out.append(StartMigration(ev.order))
    return m.state


def on_migrate_refused(m: NodeRound, ev: MigrateOrder, now: float, out: Out) -> NodeState:
    out.append(StartMigration(ev.order, refused=f"this node is {m.state.value}, not RUNNING: a recovery or the "
                                               "job's end is under way"))
    return m.state


def on_assign_ignored(m: NodeRound, ev: AssignOrder, now: float, out: Out) -> NodeState:
    out.append(Note(WARNING, "assignNode ignored: this agent is not a standby"))
    return m.state


# ------------------------------------------------------------------------------------------------ a node's life

def _began(m: NodeRound, ev: Began) -> None:
    m.facts, m.node_rank = ev.facts, ev.node_rank


def on_began_first(m: NodeRound, ev: Began, now: float, out: Out) -> NodeState:
    _began(m, ev)
    out.append(StartJob())
    return S.RUNNING


def on_began_degraded(m: NodeRound, ev: BeganDegraded, now: float, out: Out) -> NodeState:
    """No controller took a single-node job: it runs, and recovers on its own (`local_restart`)."""
    _began(m, ev)
    m.budget.degraded = True
    out.append(StartJob())
    return S.DEGRADED


def on_began_replacement(m: NodeRound, ev: BeganReplacement, now: float, out: Out) -> NodeState:
    """Its ranks never ran: they are the round's faults, counted from the node's loss, and start with its strategy."""
    _began(m, ev)
    m.add_faults(ev.faults, ev.lost_at)
    m.rejoin_since = now
    return S.REJOINING


def on_successor_joined(m: NodeRound, ev: SuccessorJoined, now: float, out: Out) -> NodeState:
    m.node_rank = ev.node_rank
    return S.RUNNING


def on_successor_gave_up(m: NodeRound, ev: SuccessorGaveUp, now: float, out: Out) -> NodeState:
    """Its migration was called off: nothing is wrong with this agent, so it stays a spare (its ranks are stopped)."""
    out.append(Note(WARNING, f"{ev.reason}: this standby waits again for a node to take over (or the job's end)"))
    return m.state


def on_began_standby(m: NodeRound, ev: Began, now: float, out: Out) -> NodeState:
    _began(m, ev)
    m.node_rank = None
    return S.STANDBY


def on_job_seen(m: NodeRound, ev: JobSeen, now: float, out: Out) -> NodeState:
    """A standby's job ended (or its controller forgot it) without needing it: exit 0."""
    if ev.state in ("SUCCEEDED", "FAILED"):
        return _not_needed(f"the job is {ev.state}", out)
    if ev.state == "":
        return _not_needed("the controller no longer knows the job", out)
    return m.state


def on_standby_lost(m: NodeRound, ev: ControllerLost, now: float, out: Out) -> NodeState:
    """A standby nobody can assign must not wait forever."""
    out.append(Finish(False, f"standby: no answer from the controller for {m.facts.controller_timeout:.0f}s "
                             "(TASKD_CONTROLLER_TIMEOUT)", exit_code=1))
    return S.ENDED


def on_rejoin_overdue(m: NodeRound, ev: RejoinOverdue, now: float, out: Out) -> NodeState:
    out.append(Note(ERROR, f"the controller named no strategy for this replacement node within {ev.timeout:.0f}s "
                           "(TASKD_NODE_REJOIN_TIMEOUT): no rank started"))
    out.append(Finish(False, f"no strategy for the replacement within {ev.timeout:.0f}s", exit_code=1))
    return S.ENDED


def on_signalled(m: NodeRound, ev: Signalled, now: float, out: Out) -> NodeState:
    out.append(Note(WARNING, f"received {ev.name}: stopping every rank"))
    out.append(Finish(False, f"agent received {ev.name}", exit_code=128 + ev.signum))
    return S.ENDED


def on_standby_signalled(m: NodeRound, ev: Signalled, now: float, out: Out) -> NodeState:
    out.append(Finish(False, "standby stopped by a signal before it was needed", exit_code=1))
    return S.ENDED


def on_ended(m: NodeRound, ev: Ended, now: float, out: Out) -> NodeState:
    out.append(Finish(ev.succeeded, ev.reason, exit_code=ev.exit_code))
    return S.ENDED


# ------------------------------------------------------------------------------------------------ mechanics' results

def on_started(m: NodeRound, ev: StartResult, now: float, out: Out) -> NodeState:
    """The launcher started the ranks (or not). Ranks already gone come next, as their own events."""
    plan = m.plan
    assert plan is not None
    rest = S.DEGRADED if m.degraded else S.STOPPING
    if ev.code != 0:
        out.append(AbandonRebuild())
        if not plan.degraded:
            out.append(SendReport(STATUS, plan.faults, ev.message, 1, plan.strategy))
        return rest  # the controller chooses again (or, degraded, the ranks' exits bring the next restart)
    if m.facts.live and plan.strategy in Strategy.REJOIN and not plan.degraded:
        return S.REBUILDING  # reported when every local rank has rejoined
    if not plan.degraded:
        out.append(SendReport(STATUS, plan.faults, "", Code.OK, plan.strategy))
    out.append(RecordRestart(plan.strategy, tuple(sorted(plan.faults)), plan.started, plan.degraded))
    m.close()
    return S.DEGRADED if m.degraded else S.RESUMING


def on_rejoined(m: NodeRound, ev: GroupRejoined, now: float, out: Out) -> NodeState:
    plan = m.plan
    assert plan is not None
    out.append(SendReport(STATUS, plan.faults, "", Code.OK, plan.strategy, rejoined=True))  # the recover settled
    out.append(RecordRestart(plan.strategy, tuple(sorted(plan.faults)), plan.started, generation=ev.generation))
    m.close()
    return S.RESUMING


def on_rejoined_unreported(m: NodeRound, ev: GroupRejoined, now: float, out: Out) -> NodeState:
    """A job-rescheduling's group re-formed: the controller already has this node's status."""
    strategy = m.plan.strategy if m.plan is not None else Strategy.JOB_RESCHEDULING
    out.append(Note(INFO, f"the group re-formed (generation {ev.generation}, {strategy}) {now - ev.started:.3f}s "
                          "after the fault"))
    return m.state


def on_group_failed(m: NodeRound, ev: GroupFailed, now: float, out: Out) -> NodeState:
    plan = m.plan
    assert plan is not None
    out.append(AbandonRebuild())
    out.append(Note(WARNING, f"live recovery failed: {ev.detail}"))
    code = Code.RETRY_FAILED_UNRECOVERABLE if plan.strategy == Strategy.RETRY else 1
    out.append(SendReport(STATUS, plan.faults, ev.detail, code, plan.strategy))
    return S.STOPPING  # the controller tries its next strategy


def on_group_failed_unreported(m: NodeRound, ev: GroupFailed, now: float, out: Out) -> NodeState:
    out.append(AbandonRebuild())
    out.append(Note(WARNING, f"live recovery failed: {ev.detail}"))
    return S.RUNNING if m.state is S.RESUMING else m.state  # its resumption will not be seen


def on_resumed(m: NodeRound, ev: Resumed, now: float, out: Out) -> NodeState:
    """Training is running again (or nothing here can tell): the round is over on this node, and taskd's
    controller hears it (the round's time to training resumed is the last node's)."""
    if m.state is not S.RESUMING:
        return m.state
    plan = m.plan
    if plan is not None and plan.round is not None and not plan.degraded:
        out.append(TellResumed(plan.round, ev.seconds, ev.at, ev.seen, ev.restores))
    return S.RUNNING
