"""One job's recovery state, and the steps a round is made of (open, stop, collect, decide, fail).

`Job` holds data and the steps the handlers of `taskd.controller.machine.handlers` compose; which handler
runs for which event is the table's business (`taskd.controller.machine.table`), and `JobMachine`
(`taskd.controller.machine.state_machine`) is the entry point that applies it. No I/O, no clock: `now` is passed in.
"""

from __future__ import annotations

from typing import Any

from taskd.controller.machine.agents import AgentInfo, AgentTable
from taskd.controller.machine.events import (
    AgentLossDue,
    Event,
    JobInit,
    JoinDue,
    LastCallDue,
    Outcome,
    Record,
    RejoinDue,
    Signal,
    StandbyDisconnected,
    StreamEndedDue,
    Tick,
)
from taskd.controller.machine.model import ACTIVE, TERMINAL, Fence, JobState, MachineConfig, Round, fmt_faults
from taskd.controller.machine.strategy import RESTARTING, charged, choose_strategy, unsettled
from taskd.vocabulary import Action, FaultRanks, SignalType, Strategy

S = JobState
BROADCAST_SETS_KEPT = 16
"""The fault sets a round's stopTrains sent that an answer is recognised as stale by: the last 16, each at most the
job's ranks (100,000 ints, ~4 MB, without ranksPerNode); before, every merged report kept one more (issue 31, F5)."""


def _silent_standbys(m: Job) -> dict[tuple[str, int], float]:
    """{(host, pid): when it counts as gone} of the standbys without a stream (registered and never subscribed,
    or not back after a controller restart): `agent_loss_timeout` after, as for an agent."""
    if m.state in TERMINAL:
        return {}
    limit = m.config.agent_loss_timeout
    return {k: s.gone_since + limit for k, s in m.standbys.items() if not s.subscribed and s.gone_since is not None}


class Job:
    """Recovery state of one job: counters, the open round, the agents, the next deadline."""

    def __init__(self, job_id: str, config: MachineConfig, now: float, init: JobInit | None = None) -> None:
        self.job_id = job_id
        self.config = config
        self.state = S.RUNNING
        self.created_at = now
        self.updated_at = now
        self.ranks_per_node = 0
        self.max_restarts = config.default_max_restarts
        self.policy: tuple[str, ...] = ()
        self.restarts = 0
        self.round_counter = 0
        self.round: Round | None = None
        self.queued: FaultRanks = {}
        self.deadline: float | None = None
        self.recover_succeeded_at: float | None = None
        # the ranks that recover restarted (None: unknown, e.g. after a controller restart), and whether every
        # agent confirmed its ranks re-formed their group with them (live recovery): the settle rule's inputs
        self.recover_ranks: frozenset[int] | None = None
        self.recover_rejoined = False
        self.unsettled_recovers = 0
        self.recover_banned = False
        self.agents = AgentTable()  # changed only through its methods, which keep its counts in step
        # when the first agent of this run registered: the join timeout counts from it (None: none yet, or
        # not known since a controller restart, then derived from the stored agents)
        self.first_registered_at: float | None = None
        self.info = ""
        self.signal_seq = 0
        self.last_signal: Signal | None = None
        # node ranks a node-loss round waits for a replacement of -> since when (the rejoin clock)
        self.rejoining: dict[int, float] = {}
        # identities declared lost, by (node rank, host, pid): whatever they send is refused (411)
        self.fences: dict[tuple[int, str, int], Fence] = {}
        # standby agents by (host, pid) (taskd.controller.nodes.standby); kept across a reset: they wait on the job id
        self.standbys: dict[tuple[str, int], Any] = {}
        # scale-in (taskd.controller.nodes.resize): the fewest nodes the job may go on with (0: fixed size), and the
        # node ranks it runs without since a downgrade -> since when (a later Register for one grows it back)
        self.min_nodes = 0
        self.absent: dict[int, float] = {}
        self.paces: Any = None  # the agents' pace reports and straggler verdicts (controller/nodes/stragglers.py); soft
        self.replicas: Any = None  # each node's snapshot replication and its buddy (controller/nodes/replicas.py); soft
        self.node_move: Any = None  # the node migration in progress (controller/nodes/node_migration.py); soft
        self.resume_watch: Any = None  # the last round's nodes saying training resumed (controller/machine/resumed.py)
        self.apply_init(init or JobInit())

    # ------------------------------------------------------------------ queries

    @property
    def node_count(self) -> int:
        return self.agents.node_count

    @property
    def round_number(self) -> int:
        return self.round.number if self.round else self.round_counter

    def expected_nodes(self) -> set[int]:
        """The nodes the job runs on now: all of them but those a downgrade left out."""
        return set(range(self.node_count)) - self.absent.keys()

    def gone_agents(self) -> dict[int, float]:
        """{node rank: since when} of unfinished agents without a signal stream."""
        return self.agents.gone()

    @property
    def loss_deadline(self) -> float | None:
        """When the first gone agent counts as lost; None while no agent is gone or loss does not apply."""
        return self.agents.first_loss_at() if self.state in ACTIVE else None

    @property
    def rejoin_deadline(self) -> float | None:
        """When the node awaited longest gets no replacement any more (`node_rejoin_timeout` after its loss)."""
        if self.state not in ACTIVE or not self.rejoining:
            return None
        return min(self.rejoining.values()) + self.config.node_rejoin_timeout



    def missing_nodes(self) -> list[int]:
        """The expected nodes no agent has registered for (O(nodes): for the join timeout's verdict only)."""
        return [n for n in range(self.node_count) if n not in self.agents]

    @property
    def join_deadline(self) -> float | None:
        """When the nodes still missing count as never joining: `join_timeout` after the first agent registered.
        None once every node registered, before any did, or while the job is not ACTIVE. O(1)."""
        agents = self.agents
        if self.state not in ACTIVE or not len(agents) or len(agents) + len(self.absent) >= self.node_count:
            return None  # absent: a MIN:MAX job that started without them (last_call_deadline) or scaled in
        if self.first_registered_at is None:  # restored after a controller restart: from the stored agents
            stamps = [a.registered_at for a in agents.values() if a.registered_at > 0]
            self.first_registered_at = min(stamps) if stamps else self.created_at
        return self.first_registered_at + self.config.join_timeout

    @property
    def wake_at(self) -> float | None:
        """When the caller must next deliver `due_events` (the round's deadline, an agent's loss, the join timeout,
        a standby without a stream)."""
        times = [t for t in (self.deadline, self.loss_deadline, self.join_deadline, self.rejoin_deadline,
                             last_call_deadline(self),
                             min(_silent_standbys(self).values(), default=None)) if t is not None]
        return min(times) if times else None

    def due_events(self, now: float) -> list[Event]:
        """The timer events due at `now`; an agent's loss first, so a failed job skips its round timeout."""
        due: list[Event] = []
        first = self.agents.first_loss() if self.state in ACTIVE else None
        if first is not None and first[0] <= now:
            a = self.agents[first[1]]
            silent = a.loss_after >= self.config.agent_loss_timeout
            due.append(AgentLossDue() if silent else StreamEndedDue())
        rejoin = self.rejoin_deadline
        if rejoin is not None and rejoin <= now:
            due.append(RejoinDue())
        join = self.join_deadline
        if join is not None and join <= now:
            due.append(JoinDue())
        last_call = last_call_deadline(self)
        if last_call is not None and last_call <= now:
            due.append(LastCallDue())
        if self.deadline is not None and self.deadline <= now:
            due.append(Tick())
        for (host, pid), at in sorted(_silent_standbys(self).items()):
            if at <= now:
                s = self.standbys[(host, pid)]
                due.append(StandbyDisconnected(host=host, pid=pid, silent=round(now - (s.gone_since or now), 3)))
        return due

    def holder(self, node_rank: int, host: str, pid: int, now: float) -> AgentInfo | None:
        """The live agent that holds node `node_rank` against a caller from (`host`, `pid`), if any.

        In a live job an agent holds its node until it finished or the controller declared it lost (a node is
        handed over only by a node-loss round: its ranks died with their agent); in a finished job, while its
        stream is open or it is online. The same (host, pid) is the same agent reconnecting. Clients that send
        no host and pid (TaskD's, whose ClientInfo has no fields 100+) are all ("", 0): indistinguishable, so
        treated as one agent."""
        a = self.agents.get(node_rank)
        if a is None or (a.host, a.pid) == (host, pid):
            return None
        if a.subscribed:
            return a
        if self.state in TERMINAL or a.finished:
            return a if a.online and not a.finished else None
        return None if (node_rank, a.host, a.pid) in self.fences else a

    def holder_refusal(self, node_rank: int, host: str, pid: int, now: float) -> str:
        """Why a Register/Subscribe from (`host`, `pid`) may not take node `node_rank` ("" if it may)."""
        a = self.holder(node_rank, host, pid, now)
        if a is None:
            return ""
        if a.subscribed:
            how = "its signal stream is open"
        else:
            silent = a.loss_after >= self.config.agent_loss_timeout
            how = "registered, its signal stream not open yet" if silent else "its signal stream is closed"
            if a.loss_at is not None:
                how += f"; it is declared lost in {max(a.loss_at - now, 0):.1f}s unless it returns"
        return (f"node {node_rank} of job {self.job_id} is held by a live agent (host {a.host!r}, pid {a.pid}: {how}); "
                f"a second agent from host {host[:64]!r}, pid {pid} is refused. Is the node rank "
                "(TASKD_NODE_RANK / --node-rank) given to two agents? A replacement is let in once the controller "
                "declared the node's agent lost (its node-loss round then waits for it): register again then")

    def owed_signal(self, node_rank: int) -> Signal | None:
        """The current phase's signal if this agent still owes an answer to it (re-sent on reconnect)."""
        r = self.round
        if r is None or self.last_signal is None or node_rank not in r.participants:
            return None
        owes = (
            (self.state == S.STOPPING and node_rank not in r.acks)
            or (self.state == S.COLLECTING and node_rank not in r.reports)
            or (self.state == S.RECOVERING and node_rank not in r.statuses)
        )
        return self.last_signal if owes else None

    # ------------------------------------------------------------------ settings and effects

    def apply_init(self, ev: JobInit) -> None:
        """Take the job's shape, budget and policy from an Init."""
        self.agents.set_node_count(ev.node_count if ev.node_count > 0 else 1)
        self.ranks_per_node = ev.ranks_per_node
        self.max_restarts = ev.max_restarts if ev.max_restarts is not None else self.config.default_max_restarts
        self.policy = tuple(ev.strategies)
        self.min_nodes = ev.min_nodes

    def reset(self, ev: JobInit) -> None:
        """Forget the run (agents, round, budget spent) and start over with `ev`; the history stays."""
        self.agents = AgentTable()  # a new table, not cleared: an event that cannot be stored puts the old one back
        self.first_registered_at = None
        self.round = None
        self.queued.clear()
        self.restarts = 0
        self.recover_succeeded_at = None
        self.recover_ranks = None
        self.recover_rejoined = False
        self.unsettled_recovers = 0
        self.recover_banned = False
        self.paces = None
        self.replicas = None
        self.resume_watch = None
        self.deadline = None
        self.last_signal = None
        self.rejoining = {}
        self.absent = {}
        self.fences = {}
        self.apply_init(ev)
        self.info = ""

    def signal(self, signal_type: str, actions: tuple[str, ...], faults: FaultRanks | None = None,
               strategy: str = "", timeout: int = 0, reason: str = "", nodes: tuple[int, ...] | None = None,
               extra: tuple[tuple[str, object], ...] = (), keep: bool = True) -> Signal:
        """A new signal of this job (the newest is kept, to re-send to an agent that still owes an answer;
        `keep=False` for one addressed to a single agent outside the round)."""
        self.signal_seq += 1
        items = tuple(sorted((faults or {}).items()))
        per_node = self.ranks_per_node
        if nodes is None:
            nodes = tuple(sorted({rank // per_node for rank, _ in items})) if per_node > 0 else ()
        sig = Signal(
            uuid=f"{self.job_id}-{self.round_number}-{self.signal_seq}",
            signal_type=signal_type, actions=actions,
            faults=items, strategy=strategy, timeout=timeout, reason=reason, nodes=nodes,
            generation=self.signal_seq, restarts=self.restarts, round=self.round_number, extra=extra,
        )
        if keep:
            self.last_signal = sig
        return sig

    def record(self, out: Outcome, kind: str, **detail: Any) -> None:
        out.records.append(Record(kind, self.round_number, detail))

    # ------------------------------------------------------------------ the steps of a round

    def open_round(self, faults: FaultRanks, now: float, out: Outcome, lost: dict[int, float] | None = None
                   ) -> JobState:
        """A new round for `faults`; `lost`: the nodes whose agents were lost (not asked, awaited for replacement),
        each with the time of its fault, which the round counts from (its declaration came a grace later)."""
        self.round_counter += 1
        r = Round(number=self.round_counter, started_at=min([now, *(lost or {}).values()]), faults=dict(faults),
                  participants=self.expected_nodes() - set(lost or ()) - set(self.rejoining), lost=dict(lost or {}))
        self.round = r
        self.info = f"round {r.number}: faults {fmt_faults(r.faults)}"
        self.record(out, "round_started", faults=fmt_faults(r.faults))
        if self.recover_succeeded_at is not None:
            since = now - self.recover_succeeded_at
            restarted = self.recover_ranks is None or bool(self.recover_ranks & r.faults.keys())
            rejoined = self.recover_rejoined and self.recover_ranks is not None
            why = unsettled(since, self.config.settle_window, restarted, rejoined)
            if why:
                self.unsettled_recovers += 1
                r.excluded.update({Strategy.RETRY: why, Strategy.RECOVER: why})
                r.tried.append(Strategy.RECOVER)  # that recover's restart pays for this round's: one in all
                if self.unsettled_recovers >= 2:
                    self.recover_banned = True
                self.record(out, "recover_unsettled", seconds_since=round(since, 3), count=self.unsettled_recovers,
                            recover_banned=self.recover_banned, restarted_rank=restarted, rejoined=rejoined)
            self.recover_succeeded_at = None
            self.recover_ranks = None
            self.recover_rejoined = False
        return self.broadcast_stop(now, out)

    def broadcast_stop(self, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        r.acks = set()  # the per-agent sets are replaced, never cleared (see taskd.controller.storage.checkpoint)
        r.reports = {}
        if not r.participants:  # every agent of the round was lost: nobody to stop or ask
            return self.to_collecting(now, out)
        sent = frozenset(r.faults)
        if not r.broadcast_sets or r.broadcast_sets[-1] != sent:  # a merge that changed only a fault type: same set
            r.broadcast_sets = [*r.broadcast_sets[-(BROADCAST_SETS_KEPT - 1):], sent]
        out.signals.append(self.signal(SignalType.STOP_TRAIN, (Action.STOP_TRAIN,), r.faults,
                                       extra=awaiting(self, now)))
        self.deadline = now + self.config.stop_timeout
        return S.STOPPING

    def to_collecting(self, now: float, out: Outcome) -> JobState:
        r = self.round
        assert r is not None
        r.reports = {}
        if not r.participants:
            return self.decide_or_wait(now, out)
        out.signals.append(self.signal(SignalType.GLOBAL_FAULT, (Action.ON_GLOBAL_RANK,), r.faults,
                                       extra=awaiting(self, now)))
        self.deadline = now + self.config.strategy_timeout
        return S.COLLECTING

    def decide_or_wait(self, now: float, out: Outcome) -> JobState:
        """Decide, unless the round still awaits a lost node's replacement: then REJOINING (no deadline of its
        own; `rejoin_deadline` bounds it)."""
        r = self.round
        assert r is not None
        if not self.rejoining:
            return self.decide(now, out)
        self.deadline = None
        nodes = sorted(self.rejoining)
        self.info = (f"round {r.number}: waiting up to {self.config.node_rejoin_timeout:g}s (--node-rejoin-timeout) "
                     f"for a replacement of node(s) {', '.join(map(str, nodes))}")
        self.record(out, "rejoin_waiting", nodes=nodes, timeout=self.config.node_rejoin_timeout)
        return S.REJOINING

    def decide(self, now: float, out: Outcome) -> JobState:
        """Choose the round's strategy (`choose_strategy`) and tell every agent; exit ends the job. The
        survivors' offers decide; the replacements of lost nodes then take part like any agent."""
        r = self.round
        assert r is not None
        if r.lost and any(n not in r.reports for n in r.lost):
            # a replacement starts from nothing and can carry out any strategy: what the survivors offered
            # decides (a job all of whose agents were lost is restarted by its replacements)
            r.reports = {**r.reports, **{n: tuple(Strategy.ORDER) for n in r.lost if n not in r.reports}}
            if not r.participants:
                r.participants = set(r.lost)
        chosen, skipped = choose_strategy(self, r)
        if chosen in RESTARTING and not charged(chosen, r):  # once per round, even across a controller restart
            self.restarts += 1
        r.strategy = chosen
        r.strategy_started_at = now
        r.statuses = set()
        r.tried.append(chosen)
        self.record(out, "strategy_chosen", strategy=chosen, skipped=skipped,
                    restarts=self.restarts, max_restarts=self.max_restarts)
        if chosen == Strategy.JOB_RESCHEDULING:
            self.take_queued(r, out)
        timeout = 0 if chosen == Strategy.EXIT else int(round(self.config.recover_timeout))
        info = ""
        if chosen == Strategy.EXIT:
            reason = "; ".join(f"{k}: {v}" for k, v in skipped.items())
            info = f"exit after round {r.number} (faults {fmt_faults(r.faults)}): {reason}"
        out.signals.append(self.signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), r.faults,
                                       strategy=chosen, timeout=timeout, reason=info))
        if chosen == Strategy.EXIT:
            return self.fail(info, now, out, outcome="failed", notify=False)
        if r.lost:
            r.participants = r.participants | set(r.lost)  # the replacements report their recover status too
        self.deadline = now + self.config.recover_timeout
        return S.RECOVERING

    def take_queued(self, r: Round, out: Outcome) -> None:
        """A job-rescheduling restarts every rank: the faults queued before it (reported while an earlier strategy
        of the round ran) are of processes it replaces, so they join this round instead of opening the next one,
        which would recover a rank already restarted and wait for a rejoin that never comes."""
        if not self.queued:
            return
        r.faults.update(self.queued)
        self.record(out, "round_faults", faults=fmt_faults(r.faults), joined=fmt_faults(self.queued),
                    why="queued before a job-rescheduling, which restarts them")
        self.queued.clear()

    def close_round(self, outcome: str, now: float, out: Outcome) -> None:
        r = self.round
        if r is None:
            return
        since_loss = {str(n): round(now - t, 6) for n, t in sorted(r.lost.items())}
        self.record(out, "round_ended", outcome=outcome, strategy=r.strategy, tried=list(r.tried),
                    duration=round(now - r.started_at, 6),
                    **({"since_loss": since_loss} if since_loss else {}))

    def fail(self, info: str, now: float, out: Outcome, outcome: str = "failed", notify: bool = True) -> JobState:
        """End the job FAILED; `notify` tells every agent to stop all ranks (changeStrategy exit)."""
        if self.round is None and notify:
            self.round_counter += 1
            self.round = Round(number=self.round_counter, started_at=now, faults={}, participants=self.expected_nodes())
            self.record(out, "round_started", faults="", reason=info)
        r = self.round
        if r is not None and notify:
            r.strategy = Strategy.EXIT
            r.tried.append(Strategy.EXIT)
            self.record(out, "strategy_chosen", strategy=Strategy.EXIT, skipped={}, reason=info)
            out.signals.append(self.signal(SignalType.CHANGE_STRATEGY, (Action.CHANGE_STRATEGY,), r.faults,
                                           strategy=Strategy.EXIT, reason=info))
        self.close_round(outcome, now, out)
        self.queued.clear()
        self.deadline = None
        self.info = info
        self.record(out, "job_failed", info=info)
        return S.FAILED

    def strategy_failed(self, why: str, now: float, out: Outcome) -> JobState:
        """The current strategy failed: the next one is chosen at once; a failed dump or exit ends the job."""
        r = self.round
        assert r is not None
        r.failed.append(r.strategy)
        self.record(out, "strategy_failed", strategy=r.strategy, reason=why)
        if r.strategy in Strategy.TERMINAL or r.strategy in Strategy.RESIZE:  # no other way to that size
            return self.fail(f"{r.strategy} failed: {why}", now, out)
        return self.decide(now, out)


def awaiting(m: Job, now: float) -> tuple[tuple[str, object], ...]:
    """A node-loss round's stopTrain and globalFault tell the survivors what the round waits for, and how long at
    most (extraParams "awaiting", "rejoin_left", "rejoin_timeout"): their consoles say so (agent/link/node_loss.py);
    and "fault_ago", the seconds since the lost node's fault, which their recovery is timed from."""
    deadline = m.rejoin_deadline
    if deadline is None:
        return ()
    r = m.round
    since = (("fault_ago", round(max(now - min(r.lost.values()), 0.0), 3)),) if r is not None and r.lost else ()
    return (("awaiting", sorted(m.rejoining)), ("rejoin_left", round(max(deadline - now, 0.0), 3)),
            ("rejoin_timeout", m.config.node_rejoin_timeout), *since)


def last_call_deadline(m: Job) -> float | None:
    """When a `--nnodes MIN:MAX` job starts with the nodes present: `last_call_timeout` after its nodes
    0..MIN-1 all registered, while it has not started yet (no node absent, no round, nothing restarted), some
    node is missing and the nodes present are 0..K-1 (the ranks keep their global ranks, node 0 hosts the
    rendezvous: a gap waits for its node or the join timeout). None otherwise. O(nodes registered) while it
    may apply, O(1) once the job runs."""
    agents, low = m.agents, m.min_nodes
    if (m.state is not S.RUNNING or not 0 < low < m.node_count or m.absent or m.round is not None
            or m.restarts or len(agents) >= m.node_count or len(agents) < low
            or any(n not in agents for n in range(len(agents)))):
        return None
    return max(agents[n].registered_at for n in range(low)) + m.config.last_call_timeout


def rerun_refusal(m: Job, node_rank: int, standby: bool) -> str:
    """Why an Init from an unknown caller may not start this FAILED job again ("" if it may): node `node_rank`'s
    agent of the failed run died without finishing (no finish report, its stream gone), so the caller is taken
    for that node's pod or process started again (Kubernetes recreates a killed pod under the same job id). A
    reset would run a one-node job that waits `join_timeout` for nodes that ended long ago. A new run is every
    node started again: a node whose agent finished (killMaster) or is still online resets the job as before."""
    a = m.agents.get(node_rank)
    if m.state is not S.FAILED or standby or a is None or a.finished or a.online or a.subscribed:
        return ""
    return (f"job {m.job_id} FAILED ({m.info[:300]}), and node {node_rank}'s agent of that run (host "
            f"{a.host[:64]!r}, pid {a.pid}) died without finishing: this is taken for its pod started again, and a "
            "failed job is not restarted from one node. Start the whole job under a new job id (--job-id, "
            "--rdzv-id or MINDX_TASK_ID)")
