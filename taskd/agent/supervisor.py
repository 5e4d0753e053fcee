"""The agent's main loop: watch ranks, report faults, carry out what the controller decides.

Everything that touches rank processes runs on the thread that called `run()` (msrun's main
thread, or `taskd run`'s): the launcher's callbacks are not thread-safe, and PR_SET_PDEATHSIG
fires when the *thread* that spawned a rank exits. The subscriber thread only queues orders.

The parts: `ranks.table` (the rank table), `ranks.control` (the launcher's callbacks and process groups),
`watches.hangs` (heartbeats, stack dumps), `link.controller` and `link.reports` (the controller), `round.rules`
(what the node's recovery round does next, a pure rule table), `round.actions` (carrying its actions out),
`round.states` (what the agent decides alone: `LocalPolicy`, `LossTimer`). This module only sequences them: it pulls
events (pidfd exits, orders, timers, signals), feeds them to the machine one at a time (`_feed`) and has
its executors carry out the actions.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from taskd.agent.config import AgentConfig, new_job_id
from taskd.agent.link.controller import ControllerLink, LocalController
from taskd.agent.link.job_status import await_job_end, join_or_end
from taskd.agent.link.node_loss import LossWait, NodeLoss
from taskd.agent.ranks.control import LauncherDetails, MsrunLogs, RankControl
from taskd.agent.ranks.launcher import launcher_of
from taskd.agent.ranks.live import LiveRanks
from taskd.agent.ranks.resize import present_nodes
from taskd.agent.ranks.table import Rank, RankLayout, RankState, RankTable, discover_layout
from taskd.agent.round import events as ev
from taskd.agent.round.actions import AgentHooks, Executors, Gone
from taskd.agent.round.rules import RoundMachine
from taskd.agent.round.states import LocalPolicy, NodeFacts, NodeState
from taskd.agent.snapshots.replication import Replication
from taskd.agent.summary import REFUSED, FaultRecord, JobResult
from taskd.agent.watches.exits import DepartureWatch
from taskd.agent.watches.hangs import Hang, HangWatch
from taskd.agent.watches.metrics import NodeMetrics, sample_ranks
from taskd.agent.watches.straggler_moves import straggler_moves
from taskd.agent.watches.stragglers import StragglerWatch
from taskd.callbacks import MONITOR, STATUS_FAILED
from taskd.client import ClientCredentials, ConfigurationError
from taskd.process.exitcodes import describe_returncode, job_exit_code, killed_by_signal
from taskd.process.pidfd import RankWatch
from taskd.vocabulary import FaultType

log = logging.getLogger("taskd.agent")


class Supervisor:
    """One job on one node, from START_ALL_WORKER to the last rank's end.

    `controller` is the embedded controller to start when `config.server` is None; the caller
    builds it (taskd run, the msrun plugin's compatibility shim), so the agent needs no controller code.
    """

    def __init__(self, config: AgentConfig, callbacks: dict[str, Callable[..., Any]],
                 details: LauncherDetails | None = None, controller: LocalController | None = None,
                 credentials: ClientCredentials | None = None, snapshot_dir: str | None = None,
                 ward_bytes: int = 0) -> None:
        """`snapshot_dir`: the job's snapshot directory here, replicated to a buddy; its copies here: `ward_bytes`."""
        self.config = config
        self.cb = callbacks
        self.details = details = launcher_of(details)  # msrun's: a null object (agent/ranks/launcher.py)
        self.controller = controller
        self.result = JobResult()
        self.policy = LocalPolicy(config.max_restarts, config.controller_timeout, config.dump_timeout)
        self.watch = RankWatch()
        self.logs = MsrunLogs(config.log_dir, enabled=not details.rank_files)
        self.hang = HangWatch(details, config.heartbeat_timeout, lambda rank: self.logs.worker_log(rank.global_rank),
                              auto=config.launcher == "msrun")
        self.table = RankTable()  # laid out from MONITOR when the job starts
        self.control = RankControl(config, callbacks, details, self.table, self.watch, self.hang, self.logs)
        self.link = ControllerLink(config, self.watch.wake, controller, credentials)
        if config.scales:  # MIN:MAX: ranks start with the nodes the job runs on now (controller/nodes/resize.py)
            self.control.node_count_now = lambda: None if (a := self.link.absent()) is None else present_nodes(
                config.node_count or 1, a)
        self.live = LiveRanks(self.table, details)  # live recovery (agent/ranks/live.py)
        self.departures = DepartureWatch(self.table)  # a group rank's exit 0 before its loop's end
        failure_code = lambda: 1 if (f := self.result.first_failure) is None else job_exit_code(f.returncode)  # noqa: E731
        hooks = AgentHooks(self._finish, failure_code, lambda: self.result.capture_first_failure(self.details),
                           self._take_node, self._lay_out)
        self.executors = Executors(self.table, self.control, self.link, self.policy, self.hang, self.result, hooks,
                                 self.live, snapshot_dir)
        self.machine = RoundMachine(NodeFacts(), self.executors.view, budget=self.policy)  # the round (agent/round_*)
        self._events: deque[object] = deque()  # what the machine handles next, one at a time (`_feed`)
        self._draining = False
        self.node_loss = NodeLoss(self.config, self.link, self.table, details)  # issue 17
        self.replication = Replication(snapshot_dir, self.link, ward_bytes) if snapshot_dir else None  # issue 33
        self.loss_wait = LossWait()  # a survivor's console while its round awaits a replacement
        self._terminate_signal: int | None = None
        self._done = False
        self._old_handlers: dict[int, Any] = {}
        self.metrics = NodeMetrics() if config.metrics_listen else None  # --metrics-listen (agent/watches/metrics.py)
        self.stragglers = (StragglerWatch(config.straggler_factor, config.straggler_interval, socket.gethostname(),
                                          straggler_moves(config, self.table, self.executors.migrations,
                                                          lambda: self.machine.state.value))
                           if config.straggler_factor else None)  # --straggler-factor (agent/watches/stragglers.py)

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> JobResult:
        self._install_signal_handlers()
        try:
            if self.metrics is not None and self.config.metrics_listen is not None:
                try:
                    self.metrics.serve(self.config.metrics_listen)
                except OSError as exc:  # before any rank starts: a clear error, not a traceback
                    raise ConfigurationError(f"--metrics-listen {self.config.metrics_listen}: cannot listen there "
                                             f"({exc.strerror or exc}): give a free port, or drop the flag") from None
            self._prepare()
            if not self._done:  # a multi-node job that found no controller stops before any rank starts
                self._invoke_run()
        except ConfigurationError as exc:  # e.g. a malformed MINDX_SERVER_IP: say so, no traceback into msrun
            log.error("taskd cannot start the job: %s", exc)
            self._end(False, 2, f"configuration error: {exc}")
        except BaseException as exc:
            if not self._done:
                log.error("agent failed: %s: %s; stopping every rank", type(exc).__name__, exc)
                self._end(False, 1, f"agent error: {exc}")
            raise
        finally:
            self._shutdown()
        log.info("%s", self.result.format_summary())
        return self.result

    def _prepare(self) -> None:
        """Ask MONITOR for the layout before any rank runs, join the controller (or run degraded), and tell the
        machine how this node's life began: its first start, a replacement, a standby, degraded (the Began*
        events). An agent whose node a replacement holds already becomes a standby (agent/link/registration.py)."""
        job_id = self.config.job_id or new_job_id(self.config.launcher)
        if not self.config.standby:
            layout = self._lay_out(self.config.node_rank)
            joined = self.link.connect(job_id, layout)
            if joined or not self.node_loss.yield_node(job_id, layout.node_rank):
                self._feed(*self._began(layout, joined))
                return
        facts = NodeFacts(self.config.node_count or 1, self.live.enabled, self.config.controller_timeout)
        self._feed(self.node_loss.join_as_standby(job_id, facts))  # --standby, or its node held by a replacement

    def _lay_out(self, node_rank: int | None) -> RankLayout:
        layout = discover_layout(self.config, self.cb[MONITOR]([-1]) or {}, node_rank=node_rank)
        self.table.lay_out(layout)
        self.result.ranks = len(self.table)
        self.hang.export_dir(self.logs.log_dir)
        return layout

    def _began(self, layout: RankLayout, joined: bool, assigned: bool = False) -> list[object]:
        """Registered as node `layout.node_rank` (or not): how this node's life begins, as the machine's event."""
        facts = NodeFacts(layout.node_count, self.live.enabled, self.config.controller_timeout)
        if not joined:
            if layout.node_count > 1:
                refused = self.link.refusal
                if not refused:
                    log.error("no controller: a job of %d nodes does not run without one (its nodes could not "
                              "recover together); stopping", layout.node_count)
                return [ev.Ended(False, 1, f"the controller refused this node: {refused}" if refused else
                                 "no controller answered, and a multi-node job does not run without one")]
            return [ev.BeganDegraded(facts, layout.node_rank)]
        ended = join_or_end(self.link, self.link.job_id, layout.node_count, self.config.join_timeout,
                            lambda: self._terminate_signal)  # as after torchrun's rendezvous (link/job_status.py)
        if ended is not None:
            return [ended]
        self.control.reap_stale_msrun_workers(self.link.job_id, layout.global_ranks)  # registered: the node is ours
        replication = self.replication if layout.node_count > 1 else None
        if replication is not None:
            replication.start()
        if self.node_loss.is_replacement(layout, assigned):  # its ranks start with the round's changeStrategy
            if replication is not None:  # the lost node's snapshots, from its buddy (it says what they restore from)
                replication.restore_node(layout.node_rank, layout.global_ranks)
            lost_at = self.node_loss.lost_at(time.monotonic())
            return [ev.BeganReplacement(facts, layout.node_rank, self.node_loss.fault_ranks(), lost_at)]
        return [ev.BeganFirst(facts, layout.node_rank)]

    def _take_node(self, node_rank: int) -> list[object]:
        """The machine's TakeNode: become node `node_rank` and register as it. Returns what came of it: began as its
        replacement, ended (refused), or nothing when another replacement took it first (still a standby)."""
        why = self.node_loss.take(node_rank)
        if why:
            return [ev.Ended(False, 2, why)]
        layout = self._lay_out(node_rank)
        if self.link.register_as(layout):
            return self._began(layout, joined=True, assigned=True)
        if self.node_loss.yield_node(self.link.job_id, node_rank):
            self.node_loss.wait_again()
            return []
        return self._began(layout, joined=False)

    def _invoke_run(self) -> None:
        """Until the job ends: rank exits, the controller's orders, our own deadlines, the slow sweep."""
        next_sweep = time.monotonic() + self.config.monitor_interval
        while not self._done:
            report_at = self.link.reports.wake_at()  # a report's re-send or deadline (an answer wakes the loop itself)
            wake_at = next_sweep if report_at is None else min(next_sweep, report_at)
            if self.executors.polling:  # the ranks' files: often in a round, at leisure where they ring (actions.py)
                wake_at = min(wake_at, time.monotonic() + self.executors.poll_every(self.machine.state))
            if self.node_loss.standby_watch is not None and self.machine.standby:  # its next question
                wake_at = min(wake_at, self.node_loss.standby_watch.next_poll)
            wake_at = min(wake_at, self.hang.stops.next_at) if self.hang.on else wake_at  # _look_for_stops
            for exit_ in self.watch.wait(max(0.0, wake_at - time.monotonic())):
                self._on_exit(exit_.local_rank, exit_.pid, exit_.returncode)
            self._run_orders()
            self._feed(*self.executors.poll_migrations(time.monotonic()))
            self._poll_live()
            self._watch_controller()
            self.loss_wait.tick(time.monotonic())
            if self._terminate_signal is not None and not self._done:
                self._feed(ev.Signalled(self._terminate_signal, signal.Signals(self._terminate_signal).name))
                break
            self._poll_reports()
            self._look_for_stops()
            if time.monotonic() >= next_sweep:
                if not self.machine.standby:  # a standby runs no rank: nothing to sweep
                    self._sweep()
                next_sweep = time.monotonic() + self.config.monitor_interval
            if not self._done and self.table.all_succeeded():
                self._end(True, 0, "")

    def _run_orders(self) -> None:
        while not self._done:
            order = self.link.next_order()
            if order is None:
                return
            layout = self.table.layout
            self.loss_wait.on_order(order, time.monotonic(), layout.node_rank if layout is not None else None)
            self._feed(ev.order_event(order))

    # ----------------------------------------------------------------- the round machine
    def _feed(self, *events: object) -> None:
        """Queue events and handle them one at a time: an event an action produced (a start's result, a rank
        found gone) waits for the handler that caused it to return, never runs inside it."""
        self._events.extend(events)
        if self._draining:
            return
        self._draining = True
        try:
            while self._events and not self._done:
                self._step(self._events.popleft())
        finally:
            self._draining = False
            if self._done:
                self._events.clear()

    def _step(self, event: object) -> None:
        if isinstance(event, Gone):  # judged like any exit; its fault is queued like any other
            adopted = event.adopted
            if adopted.started:
                self._on_exit(adopted.rank.local_rank, adopted.rank.pid, entry=adopted.entry)
            else:
                self._fault(adopted.rank, "exit", FaultType.PROCESS)
            return
        try:
            follow = self.executors.carry_out(self.machine.handle(event, time.monotonic()))
        except Exception:
            if not isinstance(event, ev.OrderEvent):
                raise
            log.exception("handling %s failed", event.order.command.value)
            return
        self._events.extendleft(reversed(follow))  # next, in the order the actions produced them

    def _watch_controller(self) -> None:
        """A round waiting on a controller gone for `controller_timeout` would wait forever: recover locally
        (degraded). A standby asks its job's state; a replacement's wait for its strategy is bounded."""
        if self._done:
            return
        if self.machine.standby:
            if (seen := self.node_loss.standby_poll()) is not None:
                self._feed(seen)
            return
        rejoining = self.machine.rejoin_since if self.machine.state is NodeState.REJOINING else None
        overdue = self.node_loss.watch(time.monotonic(), rejoining)  # and: was this agent fenced?
        files = (self.hang.heartbeat(r)[0] for r in self.table.alive())  # ranks continued after a stop (issue 31)
        self.link.continued.watch(files, time.monotonic(), alone=self.policy.degraded)
        if overdue is not None:
            self._feed(overdue)
            return
        waiting = not self._done and not self.policy.degraded and self.machine.waits_on_controller
        lost_for = self.link.lost_during_round(time.monotonic(), waiting)
        if lost_for is not None:
            self._feed(ev.ControllerLost(lost_for))

    def _end(self, succeeded: bool, exit_code: int, reason: str) -> None:
        """The job ends here for a reason of the node's own (no order gave it): the machine's `Ended` event."""
        if not self._draining:
            self._events.clear()  # left by a handler that raised: the end comes first
        self._feed(ev.Ended(succeeded, exit_code, reason))

    def _finish(self, succeeded: bool, exit_code: int, reason: str) -> None:
        """The machine's Finish (and a dump's end), carried out: every rank stopped, the result recorded."""
        if self._done:
            return
        self._done = True
        self.result.succeeded = succeeded
        self.result.exit_code = 0 if succeeded else (exit_code or 1)
        self.result.reason = reason
        if not succeeded:
            self.result.capture_first_failure(self.details)
        self.control.stop(self.table.alive(), graceful=True)

    def _shutdown(self) -> None:
        alive = self.table.alive()
        if alive:
            self.control.stop(alive, graceful=True)
        self.control.ensure_all_gone()
        self.logs.finish()
        self.link.reports.finished(0 if self.result.succeeded else self.result.exit_code, self.result.reason)
        self._await_job_end()
        if self.replication is not None:
            self.replication.close()
        self.control.reap_msrun_scheduler()
        self.link.close(0 if self.result.succeeded else self.result.exit_code, self.result.reason)
        for closing in (self.watch, self.hang, self.live, self.metrics, self.stragglers):  # the last two optional
            if closing is not None:
                closing.close()
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self.result.ended = time.time()

    def _await_job_end(self) -> None:
        """Multi-node msrun: our ranks succeeded; keep the scheduler (node 0) until the job ends (job_status.py)."""
        if not (self.result.succeeded and self.link.active and self.config.launcher == "msrun"
                and self.config.scheduler_grace > 0 and self.table.layout is not None
                and self.table.layout.node_count > 1):
            return
        hosts = self.control.runs_msrun_scheduler()
        log.info("waiting up to %.0fs for the other node(s) to finish%s", self.config.scheduler_grace,
                 " (msrun's scheduler kept for them)" if hosts else "")
        end = await_job_end(self.link, self.config.scheduler_grace,
                            self.control.runs_msrun_scheduler if hosts else None,
                            lambda: self._terminate_signal is not None)
        log.info("job %s after %.1fs (%s)", end.state or "state unknown", end.waited, end.why)
        if end.failed:
            self.result.succeeded, self.result.exit_code = False, 1
            self.result.reason = f"the job failed on another node: {end.info}" if end.info else "the job failed"

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.executors.drain.signalled(signum):  # SIGUSR1: drain this node (agent/link/drain.py)
            self._terminate_signal = signum
        self.watch.wake()

    # ----------------------------------------------------------------- rank exits and faults
    def _on_exit(self, local_rank: int, pid: int, returncode: int | None = None,
                 entry: dict[str, Any] | None = None) -> None:
        rank = self.table.get(local_rank)
        if rank is None or rank.pid != pid or not rank.state.alive:
            return
        if returncode is not None:  # read from the pidfd: no need to ask the launcher first
            status = 0 if returncode == 0 else STATUS_FAILED
        else:
            status, returncode = self.control.exit_status(rank, entry)
        rank.returncode = returncode
        if rank.state is RankState.STOPPING:
            rank.state = RankState.STOPPED
            return
        if status == 0:
            watched = self.live.enabled and not self._done and \
                self.departures.exited(rank, self.live.status(rank), self.live.grouped(rank))
            rank.state = RankState.SUCCEEDED
            if not watched:
                log.info("rank %d (pid %d) finished", rank.global_rank, pid)
            return
        if killed_by_signal(returncode) and self.hang.said_done(rank):  # a script's end is no fault (32, F2)
            rank.state = RankState.SUCCEEDED
            log.warning("rank %d (pid %d) %s after it said its work was done (live.close() or taskd.worker.finished()"
                        "): its work counts as finished", rank.global_rank, pid, describe_returncode(returncode))
            return
        rank.state = RankState.FAILED
        now = time.time()
        blamed = self.hang.behind_exit(rank, self.table.in_state(RankState.RUNNING), now) if not self._done else []
        for culprit, hang in blamed:  # the hang it waited on is the fault; its exit followed from it
            self.control.stop([culprit], graceful=False)
            culprit.state, culprit.returncode = RankState.FAILED, None
            self._fault(culprit, "hang", FaultType.PROCESS, hang.describe(), unseen=hang.quiet + time.time() - now)
        why = f"it waited on hung rank(s) {sorted(c.global_rank for c, _ in blamed)}" if blamed else ""
        self._fault(rank, "exit", FaultType.PROCESS, why, say_why=bool(blamed))

    def _fault(self, rank: Rank, reason: str, fault_type: str, why: str = "", unseen: float = 0.0,
               say_why: bool = False) -> None:
        reason = REFUSED if reason == "exit" and self.live.refused(rank) else reason  # no fault, acted on as one
        record = FaultRecord(time.time(), rank.global_rank, rank.local_rank, rank.pid, rank.returncode, reason)
        self.result.add(record)
        detail = f"{record.describe()}: {why}" if why else record.describe()
        log.warning("%s: %s", record.kind, detail if say_why else record.describe())
        self._feed(ev.RankFault(rank.global_rank, rank.local_rank, fault_type, detail, unseen, self.live.stuck(rank)))

    def _poll_reports(self) -> None:
        """Answers to the reports in flight, re-sends due; a fault report settles as taken or not (link/reports.py)."""
        self.link.reports.poll(time.monotonic())
        for settled in self.link.reports.settled_faults():
            self._feed(ev.ReportSettled(settled.taken))

    # ----------------------------------------------------------------- the slow sweep
    def _sweep(self) -> None:
        """What pidfds cannot tell: launcher statuses, zombies, pid reuse, hangs; and the metrics' sample."""
        if self.metrics is not None or self.stragglers is not None:  # each rank's heartbeat read once a sweep
            beats = {r.local_rank: self.hang.heartbeat(r)[1] for r in self.table.all()}
            beat = lambda r: beats.get(r.local_rank)  # noqa: E731
        if self.metrics is not None:
            ranks = sample_ranks(self.table.all(), beat, self.metrics.clock)
            self.metrics.publish(ranks, len(self.result.faults), len(self.result.recoveries))
        if self.stragglers is not None and not self._done:
            for verdict in self.stragglers.sweep(self.table.all(), beat, self.link.reports.pace, time.monotonic()):
                (log.info if verdict.cleared else log.warning)("%s", verdict.describe(self.stragglers.factor))
        suspects = []
        for rank, pid, entry in self.control.sweep():
            if entry is not None:
                self._on_exit(rank.local_rank, pid, entry=entry)
            elif not self._done and rank.pid == pid and rank.state is RankState.RUNNING:
                suspects.append(rank)
        if suspects:
            self._check_hangs(suspects)

    def _look_for_stops(self) -> None:
        """A stopped rank (SIGSTOP, a debugger) is judged once the looks have held it stopped, not on the sweep."""
        if self.hang.on and not self._done and not self.machine.standby and time.monotonic() >= self.hang.stops.next_at:
            if self.hang.look(running := self.table.in_state(RankState.RUNNING), time.monotonic()):
                self._check_hangs(running)

    def _check_hangs(self, ranks: list[Rank]) -> None:
        """Name the culprit first (not the ranks waiting on it in a collective), take stacks, replace it."""
        now = time.time()
        for rank, done, since in self.hang.overdue_exits(ranks, now, self.config.stop_grace):
            self._overdue_exit(rank, done, since)
        ranks = [r for r in ranks if r.state is RankState.RUNNING]
        culprits, waiting = self.hang.culprits(ranks, now)
        if not culprits:
            return
        self.hang.record_all(culprits + waiting)
        for rank, hang in culprits:
            self.control.stop([rank], graceful=False)
            rank.state, rank.returncode = RankState.FAILED, None
            # its last heartbeat was `quiet` before `now`; taking the stacks since took a while more
            self._fault(rank, "hang", FaultType.PROCESS, hang.describe(), unseen=hang.quiet + time.time() - now)

    def _overdue_exit(self, rank: Rank, done: bool, since: float) -> None:
        """A finishing rank is no hang, but its exit is bounded (heartbeat timeout + stop grace): kill it. Its
        work counts as finished if the script said so (taskd.worker.finished()), else it is a fault."""
        self.control.stop([rank], graceful=False)
        what = "said its work was done" if done else "began to exit"
        log.warning("rank %d (pid %d) %s %.1fs ago and is still running (bound: heartbeat timeout %.0fs + stop "
                    "grace %.0fs): killed it%s", rank.global_rank, rank.pid, what, since, self.hang.timeout or 0,
                    self.config.stop_grace, "; its work counts as finished" if done else "")
        if done:
            rank.state = RankState.SUCCEEDED
            return
        rank.state, rank.returncode = RankState.FAILED, None
        self._fault(rank, "exit", FaultType.PROCESS, f"still exiting {since:.1f}s after it began to")

    def _poll_live(self) -> None:
        """A restart's resumption, a rebuild's progress; live recovery: a rank's RetryableError is a type-"0"
        fault of a live rank."""
        if self._done or not self.executors.polling:
            return
        errors, events = self.executors.poll(time.monotonic())
        self._feed(*events)
        for local_rank, why in errors:
            rank = self.table[local_rank]
            log.warning("rank %d (pid %s) raised a retryable error: %s", rank.global_rank, rank.pid, why)
            self._fault(rank, "retryable", FaultType.RECOVERABLE, why)
        if self.machine.state is NodeState.RUNNING:
            self._peers_tell()

    def _peers_tell(self) -> None:
        """The faults only the peers give away. A rank their timed-out collective waited for, neither waiting
        itself nor reporting: it hangs. A group rank that exited 0 before its loop's end, then its peers' group
        broke: it left early (agent/watches/exits.py). Either is replaced like a crashed rank."""
        now = time.time()
        stalled = self.live.stalled()
        hangs = [(rank, Hang(now - st.heartbeat.time if st.heartbeat.time else 0.0, st.heartbeat.step,
                             st.heartbeat.section, st.heartbeat.stack_signal)) for rank, st in stalled]
        if hangs:
            self.hang.record_all(hangs)
        for rank, hang in hangs:
            why = f"its peers' collective timed out waiting for it, and it is in none ({hang.describe()})"
            log.warning("hang: rank %d (pid %s): %s", rank.global_rank, rank.pid, why)
            self.control.stop([rank], graceful=False)
            rank.state, rank.returncode = RankState.FAILED, None
            self._fault(rank, "hang", FaultType.PROCESS, why, unseen=hang.quiet + time.time() - now)
        if not self.departures.watching:
            return
        peers = {r.local_rank: st for r in self.table.in_state(RankState.RUNNING)
                 if (st := self.live.status(r)) is not None}
        for departure, why in self.departures.left(peers):
            rank = departure.rank
            log.warning("rank %d (pid %d) left its group early: %s", rank.global_rank, departure.pid, why)
            rank.state = RankState.FAILED
            self._fault(rank, "left", FaultType.PROCESS, why)


__all__ = ["LauncherDetails", "Supervisor"]
