"""The agent's main loop: watch ranks, report faults, carry out what the controller decides.

Everything that touches rank processes runs on the thread that called `run()` (msrun's main
thread, or `taskd run`'s): the launcher's callbacks are not thread-safe, and PR_SET_PDEATHSIG
fires when the *thread* that spawned a rank exits. The subscriber thread only queues signals.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from taskd.agent.config import AgentConfig
from taskd.agent.process_tools import (
    msrun_schedulers,
    process_group,
    reap_processes,
    restart_msrun_scheduler,
    stop_groups,
    wait_groups_gone,
)
from taskd.agent.rank_watch import RankWatch
from taskd.agent.summary import FaultRecord, JobResult, RecoveryRecord
from taskd.launcher.process import exit_code_of
from taskd.toolkit.recover_module.errors import ConfigurationError
from taskd.vocabulary import Action, Code, FaultType, SignalType, Strategy
from taskd.worker.env import Var

log = logging.getLogger("taskd.agent")

RUNNING, SUCCEEDED, FAILED, STOPPING, STOPPED, NOT_STARTED = (
    "running", "succeeded", "failed", "stopping", "stopped", "not-started")
MONITOR_RUNNING, MONITOR_GONE = None, 300


class LauncherDetails(Protocol):
    """Optional extras a launcher can offer beyond msrun's four callbacks (taskd's own does)."""

    def returncode(self, local_rank: int) -> int | None: ...

    def tail_log(self, local_rank: int, n: int = 20) -> list[str]: ...

    def heartbeat_path(self, local_rank: int) -> str | None: ...

    def log_path(self, local_rank: int) -> str | None: ...


@dataclass
class Rank:
    local_rank: int
    global_rank: int
    pid: int | None = None
    pgid: int | None = None
    proc: psutil.Process | None = None  # pinned by (pid, start time): tells a reused pid from ours
    state: str = NOT_STARTED
    returncode: int | None = None


class Supervisor:
    """One job on one node, from START_ALL_WORKER to the last rank's end."""

    def __init__(self, config: AgentConfig, callbacks: dict[str, Callable[..., Any]],
                 details: LauncherDetails | None = None) -> None:
        self.config = config
        self.cb = callbacks
        self.details = details
        self.result = JobResult()
        self.ranks: dict[int, Rank] = {}
        self._watch = RankWatch()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._terminate_signal: int | None = None
        self._done = False
        self._mgr: Any = None
        self._embedded: Any = None
        self._subscriber: threading.Thread | None = None
        self._degraded = False
        self._restarts_used = 0
        self._round_faults: dict[int, int] = {}
        self._controller_lost_at: float | None = None  # monotonic; while a round waits on a lost controller
        self._round_started: float | None = None
        self._old_handlers: dict[int, Any] = {}
        self._heartbeats: dict[int, Any] = {}
        self._heartbeat_dir: str | None = None
        self._seen_signals: set[tuple[str, str]] = set()
        self._starts: dict[int, int] = {}
        self._sweeps = 0

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> JobResult:
        self._install_signal_handlers()
        try:
            self._discover_ranks()
            self._export_heartbeat_dir()
            self._connect()
            self._start_all(first=True)
            self._loop()
        except ConfigurationError as exc:  # e.g. a malformed MINDX_SERVER_IP: say so, no traceback into msrun
            log.error("taskd cannot start the job: %s", exc)
            self._finish(False, 2, f"configuration error: {exc}")
        except BaseException as exc:
            if not self._done:
                log.error("agent failed: %s: %s; stopping every rank", type(exc).__name__, exc)
                self._finish(False, 1, f"agent error: {exc}")
            raise
        finally:
            self._shutdown()
        return self.result

    def _discover_ranks(self) -> None:
        """Ask MONITOR before any rank runs: msrun answers status 200 entries with global ranks."""
        entries = self.cb["MONITOR"]([-1]) or {}
        count = self.config.ranks_per_node or len(entries)
        if count <= 0:
            raise RuntimeError("MONITOR([-1]) returned no ranks and ranks_per_node is not set: "
                               "set TASKD_NPROC_PER_NODE to the number of ranks this node runs")
        self.config.ranks_per_node = count
        node_ids = [e.get("node_id") for e in entries.values() if isinstance(e.get("node_id"), int)]
        if self.config.node_rank is None:
            if node_ids and node_ids[0] >= 0:
                self.config.node_rank = node_ids[0]
            elif 0 in entries and isinstance(entries[0].get("global_rank"), int):
                self.config.node_rank = max(0, entries[0]["global_rank"]) // count
            else:
                self.config.node_rank = 0
        if self.config.node_count is None:
            total = 0
            for var in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
                try:
                    total = int(os.environ.get(var, "0"))
                except ValueError:
                    total = 0
                if total:
                    break
            self.config.node_count = max(1, -(-total // count)) if total else 1
        for local_rank in range(count):
            entry = entries.get(local_rank, {})
            global_rank = entry.get("global_rank")
            if not isinstance(global_rank, int) or global_rank < 0:
                global_rank = self.config.node_rank * count + local_rank
            self.ranks[local_rank] = Rank(local_rank, global_rank)
        self.result.ranks = count
        self._local_of = {r.global_rank: r.local_rank for r in self.ranks.values()}

    def _export_heartbeat_dir(self) -> None:
        """Under msrun no callback takes per-rank variables: ranks inherit one directory and name their file."""
        if self.details is not None or os.environ.get(Var.TASKD_HEARTBEAT_DIR):
            self._heartbeat_dir = os.environ.get(Var.TASKD_HEARTBEAT_DIR) if self.details is None else None
            return
        import tempfile

        self._heartbeat_dir = tempfile.mkdtemp(prefix="taskd-heartbeat-")
        os.environ[Var.TASKD_HEARTBEAT_DIR] = self._heartbeat_dir

    def _connect(self) -> None:
        from taskd.proto import recover_pb2
        from taskd.toolkit.recover_module import recover_manager as rm

        cfg = self.config
        address = cfg.server
        if address is None:
            from taskd.controller.server import ControllerConfig, EmbeddedController

            self._embedded = EmbeddedController(ControllerConfig(
                listen="127.0.0.1:0", state_path=":memory:", default_max_restarts=cfg.max_restarts))
            address = self._embedded.start()
            log.debug("embedded controller on %s", address)
        info = recover_pb2.ClientInfo(
            jobId=cfg.resolved_job_id(), role="agent", nodeRank=cfg.node_rank or 0,
            nodeCount=cfg.node_count or 1, ranksPerNode=cfg.ranks_per_node or 0,
            maxRestarts=cfg.max_restarts, host=socket.gethostname(), pid=os.getpid(),
            strategies=cfg.offered_strategies)
        # An embedded controller lives and dies with this process: 3 s keepalive pings (for a remote
        # controller's death) only cost an idle agent CPU there.
        options = (("grpc.keepalive_time_ms", 60_000),) if self._embedded is not None else ()
        mgr = rm.DLRecoverManager(info, address, init_timeout=max(1.0, cfg.controller_timeout),
                                  channel_options=options)
        try:
            enabled = mgr.init_clusterd()
            if enabled:
                status = mgr.register(info)
                enabled = status.code == Code.OK
                if not enabled:
                    log.warning("controller %s refused registration: %d %s", address, status.code, status.info)
        except rm.ServerUnreachable as exc:
            log.warning("%s: running degraded (local restarts only)", exc)
            enabled = False
        if not enabled:
            mgr.stop()
            self._degraded = True
            return
        self._mgr = mgr
        rm.set_manager(mgr)
        handlers = {
            Action.STOP_TRAIN: "stop", Action.ON_GLOBAL_RANK: "strategies",
            Action.CHANGE_STRATEGY: "change", Action.SAVE_AND_EXIT: "dump",
            Action.FAULT_NODES_EXIT: "kill", SignalType.KILL_MASTER: "kill",
        }
        for name, kind in handlers.items():
            mgr.register_action_handler(name, self._queue_handler(kind))
        frame = "mindspore" if self.config.launcher == "msrun" else "pytorch"  # TaskD's default otherwise
        self._subscriber = threading.Thread(target=mgr.start_subscribe, args=(frame,), name="taskd-subscriber",
                                            daemon=True)
        self._subscriber.start()
        deadline = time.monotonic() + 5.0
        while not mgr.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        log.info("job %s: node %d of %d, %d rank(s), controller %s%s", cfg.job_id, cfg.node_rank,
                 cfg.node_count, cfg.ranks_per_node, address, " (embedded)" if self._embedded else "")

    def _queue_handler(self, kind: str) -> Callable[[Any], None]:
        def handler(sig: Any) -> None:
            # a resubscribing agent is sent the signal it still owes an answer to again, same uuid
            key = (kind, sig.uuid)
            if sig.uuid and key in self._seen_signals:
                log.debug("signal %s already handled", sig.uuid)
                return
            self._seen_signals.add(key)
            self._commands.put((kind, sig))
            self._watch.wake()
        return handler

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._terminate_signal = signum
        self._watch.wake()

    def _shutdown(self) -> None:
        alive = [r for r in self.ranks.values() if r.state in (RUNNING, STOPPING)]
        if alive:
            self._stop_ranks(alive, graceful=True)
        self._ensure_all_gone()
        if self.config.launcher == "msrun":
            schedulers = msrun_schedulers()
            if schedulers:
                log.info("reaping msrun's scheduler (pid %s)", ", ".join(str(p.pid) for p in schedulers))
                reap_processes(schedulers, self.config.stop_grace)
        if self._mgr is not None:
            try:
                self._mgr.report_finished(0 if self.result.succeeded else self.result.exit_code, self.result.reason,
                                          timeout=None if self._mgr.connected else 3.0)
            except Exception as exc:  # the job is over either way
                log.debug("could not report the end of the job: %s", exc)
            self._mgr.stop()
        if self._subscriber is not None:
            self._subscriber.join(timeout=5.0)
        if self._embedded is not None:
            self._embedded.stop()
        self._watch.close()
        for hb in self._heartbeats.values():
            hb.close()
        if self._heartbeat_dir is not None and os.environ.get(Var.TASKD_HEARTBEAT_DIR) == self._heartbeat_dir:
            import shutil

            shutil.rmtree(self._heartbeat_dir, ignore_errors=True)
            os.environ.pop(Var.TASKD_HEARTBEAT_DIR, None)
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self.result.ended = time.time()

    # ----------------------------------------------------------------- main loop
    def _loop(self) -> None:
        next_sweep = time.monotonic() + self.config.monitor_interval
        while not self._done:
            for exit_ in self._watch.wait(max(0.0, next_sweep - time.monotonic())):
                self._on_exit(exit_.local_rank, exit_.pid, exit_.returncode)
            self._run_commands()
            self._watch_controller()
            if self._terminate_signal is not None and not self._done:
                name = signal.Signals(self._terminate_signal).name
                log.warning("received %s: stopping every rank", name)
                self._finish(False, 128 + self._terminate_signal, f"agent received {name}")
                break
            if time.monotonic() >= next_sweep:
                self._sweep()
                next_sweep = time.monotonic() + self.config.monitor_interval
            if not self._done and self.ranks and all(r.state == SUCCEEDED for r in self.ranks.values()):
                self._finish(True, 0, "")

    def _watch_controller(self) -> None:
        """A round in progress waits on the controller's next signal: if the controller is gone for
        `controller_timeout`, nothing else would ever end that wait, so recover locally (degraded)."""
        if self._done or self._degraded or self._mgr is None or not self._round_faults or self._mgr.connected:
            self._controller_lost_at = None
            return
        now = time.monotonic()
        if self._controller_lost_at is None:
            self._controller_lost_at = now
        elif now - self._controller_lost_at >= self.config.controller_timeout:
            log.warning("controller lost for %.0fs in the middle of a recovery: degraded mode, restarts handled "
                        "locally", now - self._controller_lost_at)
            self._controller_lost_at = None
            self._degraded = True
            self._local_recovery()

    def _run_commands(self) -> None:
        while not self._done:
            try:
                kind, sig = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                getattr(self, f"_on_{kind}")(sig)
            except Exception:
                log.exception("handling %s failed", kind)

    def _finish(self, succeeded: bool, exit_code: int, reason: str) -> None:
        if self._done:
            return
        self._done = True
        self.result.succeeded = succeeded
        self.result.exit_code = 0 if succeeded else (exit_code or 1)
        self.result.reason = reason
        first = self.result.first_failure
        if not succeeded and first is not None and self.details is not None:
            try:
                self.result.first_failure_log = self.details.tail_log(first.local_rank, 20)
            except Exception as exc:
                log.debug("no log tail for rank %d: %s", first.global_rank, exc)
        self._stop_ranks([r for r in self.ranks.values() if r.state in (RUNNING, STOPPING)], graceful=True)

    # ----------------------------------------------------------------- rank exits
    def _exit_status(self, rank: Rank, entry: dict[str, Any] | None = None) -> tuple[int | None, int | None]:
        """(MONITOR status, raw returncode) of an exited rank; MONITOR can lag the pidfd a little.

        `entry` is a MONITOR answer the caller already holds: asked again only if it still says running.
        """
        deadline = time.monotonic() + 1.0
        while True:
            if entry is None:
                entry = (self.cb["MONITOR"]([rank.local_rank]) or {}).get(rank.local_rank, {})
            status = entry.get("status", MONITOR_GONE)
            if entry.get("pid") not in (None, rank.pid):
                status = MONITOR_GONE  # a newer incarnation: ours is gone
            if status is not MONITOR_RUNNING or time.monotonic() > deadline:
                break
            entry = None
            time.sleep(0.001)
        if status is MONITOR_RUNNING:
            status = MONITOR_GONE
        returncode = None
        if self.details is not None:
            try:
                returncode = self.details.returncode(rank.local_rank)
            except Exception:
                returncode = None
        if returncode is None:
            returncode = 0 if status == 0 else None
        return status, returncode

    def _on_exit(self, local_rank: int, pid: int, returncode: int | None = None,
                 entry: dict[str, Any] | None = None) -> None:
        rank = self.ranks.get(local_rank)
        if rank is None or rank.pid != pid or rank.state not in (RUNNING, STOPPING):
            return
        if returncode is not None:  # read from the pidfd: no need to ask the launcher first
            status = 0 if returncode == 0 else MONITOR_GONE
        else:
            status, returncode = self._exit_status(rank, entry)
        rank.returncode = returncode
        if rank.state == STOPPING:
            rank.state = STOPPED
            return
        if status == 0:
            rank.state = SUCCEEDED
            log.info("rank %d (pid %d) finished", rank.global_rank, pid)
            return
        rank.state = FAILED
        self._fault(rank, "exit", FaultType.PROCESS)

    def _fault(self, rank: Rank, reason: str, fault_type: str, why: str = "") -> None:
        record = FaultRecord(time.time(), rank.global_rank, rank.local_rank, rank.pid, rank.returncode, reason)
        self.result.faults.append(record)
        if self.result.first_failure is None:
            self.result.first_failure = record
        log.warning("fault: %s", record.describe())
        self._round_faults[rank.global_rank] = int(fault_type)
        if self._round_started is None:
            self._round_started = time.monotonic()
        if self._degraded:
            self._local_recovery()
            return
        detail = f"{record.describe()}: {why}" if why else record.describe()
        self._report_fault({rank.global_rank: int(fault_type)}, detail)

    def _report_fault(self, faults: dict[int, int], detail: str) -> None:
        from taskd.toolkit.recover_module.recover_manager import ServerUnreachable

        deadline = time.monotonic() + self.config.controller_timeout
        delay = 0.1
        while True:
            try:
                code = self._mgr.report_process_fault(faults, detail=detail)
                if code == Code.OK:
                    return
                log.warning("controller answered %d to the fault report", code)
            except ServerUnreachable as exc:
                log.warning("%s", exc)
            if time.monotonic() >= deadline or self._terminate_signal is not None:
                break
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        log.warning("controller unreachable for %.0fs: degraded mode, restarts handled locally",
                    self.config.controller_timeout)
        self._degraded = True
        self._local_recovery()

    def _local_recovery(self) -> None:
        """No controller: restart the whole node's ranks while the budget lasts (a single node keeps training)."""
        if self._restarts_used >= self.config.max_restarts:
            self._finish(False, self._failure_code(), f"restart budget of {self.config.max_restarts} spent")
            return
        self._restarts_used += 1
        log.warning("degraded: local job-rescheduling (restart %d of %d)", self._restarts_used,
                    self.config.max_restarts)
        started = time.monotonic()
        ranks = sorted(self._round_faults)
        self._stop_ranks(list(self.ranks.values()), graceful=False)
        if self._start_all() == 0:
            self._recovered(Strategy.JOB_RESCHEDULING, ranks, started, degraded=True)

    def _failure_code(self) -> int:
        first = self.result.first_failure
        return exit_code_of(first.returncode) if first is not None else 1

    # ----------------------------------------------------------------- sweep
    def _sweep(self) -> None:
        """What pidfds cannot tell: launcher statuses, zombies, pid reuse, restarts by someone else."""
        entries = self.cb["MONITOR"]([-1]) or {}
        self._sweeps += 1
        for rank in list(self.ranks.values()):
            if rank.state != RUNNING or rank.pid is None:
                continue
            entry = entries.get(rank.local_rank, {})
            gone = entry.get("status", MONITOR_RUNNING) is not MONITOR_RUNNING
            if not gone and entry.get("pid") not in (None, rank.pid):
                gone = True
            if not gone:
                gone = self._process_gone(rank)
            if gone:
                self._watch.unwatch(rank.local_rank, rank.pid)
                self._on_exit(rank.local_rank, rank.pid, entry=entry)
            elif not self._done:
                self._check_hang(rank)

    def _process_gone(self, rank: Rank) -> bool:
        """psutil's view, every 5th sweep: a zombie is dead; a pid whose create time changed was reused.

        A belt to the pidfd's braces (it already turns readable when a rank becomes a zombie), so it
        runs on a slower beat: an idle agent's CPU goes mostly to this otherwise.
        """
        if self._sweeps % 5:
            return False
        proc = rank.proc
        try:  # is_running() is False for a pid that is gone or now names another process
            return proc is None or not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # ----------------------------------------------------------------- hangs and saves
    def _heartbeat(self, rank: Rank) -> tuple[Any, Any]:
        """(the rank's heartbeat file, its current state), or (None, None) when it has none it attached to."""
        from taskd.worker.heartbeat_file import HeartbeatFile, HeartbeatFileError

        if self.details is not None and hasattr(self.details, "heartbeat_path"):
            path = self.details.heartbeat_path(rank.local_rank)
        elif self._heartbeat_dir is not None:  # a missing file fails read() below: no stat every sweep
            path = os.path.join(self._heartbeat_dir, f"rank_{rank.global_rank}.hb")
        else:
            return None, None
        if not path:
            return None, None
        cached = self._heartbeats.get(rank.local_rank)
        if cached is None or cached.path != str(path):
            cached = HeartbeatFile(path)
            self._heartbeats[rank.local_rank] = cached
        try:
            state = cached.read()
        except (HeartbeatFileError, OSError, ValueError):
            return None, None
        return (cached, state) if state.pid == rank.pid else (None, None)

    def _check_hang(self, rank: Rank) -> None:
        _, state = self._heartbeat(rank)
        if state is None:
            return
        if state.torn:  # a write left half done: the reader kept the last consistent heartbeat, judged below
            log.debug("rank %d: heartbeat file caught mid-write; using its last consistent state", rank.global_rank)
        deadline = state.deadline(self.config.heartbeat_timeout)
        if deadline is None or time.time() <= deadline:
            return
        where = f" in section {state.section!r}" if state.section else ""
        step = f" at step {state.step}" if state.step is not None else ""
        quiet = time.time() - max(state.time, state.section_start or 0.0)
        log.warning("hang: rank %d (pid %d) made no progress for %.1fs%s%s", rank.global_rank, rank.pid,
                    quiet, step, where)
        self._record_stacks(rank, state.stack_signal)
        self._stop_ranks([rank], graceful=False)
        rank.state, rank.returncode = FAILED, None
        self._fault(rank, "hang", FaultType.PROCESS, f"last heartbeat {quiet:.1f}s ago{step}{where}")

    def _record_stacks(self, rank: Rank, stack_signal: int) -> None:
        """Put the hung rank's Python stacks in its log: py-spy when installed, else faulthandler."""
        import shutil
        import subprocess

        log_path = self.details.log_path(rank.local_rank) if hasattr(self.details, "log_path") else None
        pyspy = shutil.which("py-spy") if os.environ.get("TASKD_PYSPY", "1") != "0" else None
        if pyspy and log_path:
            try:
                out = subprocess.run([pyspy, "dump", "--pid", str(rank.pid)], capture_output=True, text=True,
                                     timeout=10)
                if out.returncode == 0 and out.stdout.strip():
                    with open(log_path, "a", encoding="utf-8") as fh:
                        fh.write(f"--- taskd: stacks of hung rank {rank.global_rank} (py-spy) ---\n")
                        fh.write(out.stdout)
                    log.info("stacks of rank %d written to %s", rank.global_rank, log_path)
                    return
                log.debug("py-spy dump failed: %s", out.stderr.strip())
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.debug("py-spy dump failed: %s", exc)
        if stack_signal:
            log_path = log_path or self._msrun_worker_log(rank)
            before = _file_size(log_path)
            try:
                os.kill(rank.pid, stack_signal)
            except ProcessLookupError:
                return
            _wait_for_dump(log_path, before)
            log.info("stacks of rank %d requested with signal %d (see its log)", rank.global_rank, stack_signal)

    def _msrun_worker_log(self, rank: Rank) -> str | None:
        if self.details is not None or not self.config.log_dir:
            return None
        return os.path.join(self.config.log_dir, f"worker_{rank.global_rank}.log")

    # ----------------------------------------------------------------- starting and stopping
    def _adopt(self, local_ranks: list[int]) -> None:
        """Read new pids from MONITOR and watch them."""
        entries = self.cb["MONITOR"]([-1]) or {}
        for local_rank in local_ranks:
            rank = self.ranks[local_rank]
            entry = entries.get(local_rank, {})
            pid = entry.get("pid")
            if pid is None:  # never started: a fault like any other, or the job would wait for it forever
                rank.state, rank.pid = FAILED, None
                rank.returncode = self.details.returncode(local_rank) if self.details is not None else None
                self._fault(rank, "exit", FaultType.PROCESS)
                continue
            rank.pid, rank.state, rank.returncode = pid, RUNNING, None
            pgid = process_group(pid)
            rank.pgid = pid if pgid in (None, os.getpgrp()) else pgid  # a child that died before its setsid
            try:
                rank.proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                rank.proc = None
            if not self._watch.watch(local_rank, pid) or entry.get("status") is not MONITOR_RUNNING:
                self._on_exit(local_rank, pid, entry=entry)

    def _reset_heartbeats(self, local_ranks: list[int]) -> None:
        """A fresh incarnation must not inherit its predecessor's last heartbeat (our launcher does this itself)."""
        if self._heartbeat_dir is None:
            return
        from taskd.worker.heartbeat_file import HeartbeatFile

        for local_rank in local_ranks:
            try:
                name = f"rank_{self.ranks[local_rank].global_rank}.hb"
                HeartbeatFile(os.path.join(self._heartbeat_dir, name)).create()
            except OSError as exc:
                log.debug("cannot reset heartbeat file of rank %d: %s", local_rank, exc)

    def _keep_worker_logs(self, local_ranks: list[int]) -> None:
        """msrun reopens a restarted rank's log with "w": keep the previous incarnation's as .<n>."""
        for local_rank in local_ranks:
            path = self._msrun_worker_log(self.ranks[local_rank])
            if path is None:
                return
            starts = self._starts.get(local_rank, 0)
            self._starts[local_rank] = starts + 1
            if starts and os.path.exists(path):
                kept = f"{path}.{starts - 1}"
                try:
                    os.replace(path, kept)
                    log.debug("kept the log of rank %d's incarnation %d as %s", local_rank, starts - 1, kept)
                except OSError as exc:
                    log.warning("cannot keep %s: %s", path, exc)

    def _start_all(self, first: bool = False) -> int:
        code = self._start(None)
        pids = ", ".join(f"{r.global_rank}:{r.pid}" for r in self.ranks.values())
        log.info("%s %d rank(s) (rank:pid %s)%s", "started" if first else "restarted", len(self.ranks), pids,
                 "" if code == 0 else f"; START_ALL_WORKER returned {code}")
        return code

    def _start(self, local: list[int] | None) -> int:
        """START_ALL_WORKER (local is None) or START_WORKER_LIST(local), then watch the new processes."""
        ranks = sorted(self.ranks) if local is None else local
        if not ranks:
            return 0
        self._keep_worker_logs(ranks)
        self._reset_heartbeats(ranks)
        code = self.cb["START_ALL_WORKER"]() if local is None else self.cb["START_WORKER_LIST"](local)
        self._adopt(ranks)
        return code

    def _restart(self, strategy: str, faults: dict[int, int], started: float) -> None:
        """Carry out recover (the faulty local ranks) or job-rescheduling (every rank) and report it."""
        if strategy == Strategy.RECOVER:
            local = self._local_ranks(faults)
            self._stop_ranks([self.ranks[lr] for lr in local], graceful=False)
            code = self._start(local)
            msg = "" if code == 0 else f"START_WORKER_LIST({local}) returned {code}"
        else:
            self._stop_ranks(list(self.ranks.values()), graceful=False)
            if self.config.launcher == "msrun" and self.details is None:
                restart_msrun_scheduler(self.config.stop_grace)
            code = self._start_all()
            msg = "" if code == 0 else f"START_ALL_WORKER returned {code}"
        self._mgr.report_recover_status(Code.OK if code == 0 else 1, msg, faults, strategy)
        if code == 0:
            self._recovered(strategy, sorted(faults), started)

    def _stop_ranks(self, ranks: list[Rank], graceful: bool) -> None:
        """Stop ranks and every process of their groups; confirm with psutil before returning."""
        live = [r for r in ranks if r.pid is not None and r.state in (RUNNING, STOPPING)]
        for rank in live:
            rank.state = STOPPING
        pgids = [r.pgid or r.pid for r in ranks if r.pid is not None]
        if graceful:  # SIGTERM, grace, SIGKILL, confirmed gone
            stop_groups(pgids, self.config.stop_grace)
        else:  # the launcher's KILL_WORKER, then make sure nothing of the groups is left
            if live:
                self.cb["KILL_WORKER"]([r.pid for r in live])
            survivors = wait_groups_gone(pgids, max(self.config.stop_grace, 1.0))
            if survivors:
                stop_groups(survivors, 0.0, first_signal=signal.SIGKILL)
        for rank in live:  # a stopped rank's exit status is never read: no MONITOR round per rank
            self._watch.unwatch(rank.local_rank, rank.pid)
            if rank.state == STOPPING:
                rank.state = STOPPED

    def _ensure_all_gone(self) -> None:
        try:
            self.cb["KILL_WORKER"]([-1])
        except Exception as exc:
            log.warning("KILL_WORKER([-1]) failed: %s", exc)
        pgids = [r.pgid or r.pid for r in self.ranks.values() if r.pid is not None]
        if pgids:
            stop_groups(pgids, 0.0, first_signal=signal.SIGKILL)

    # ----------------------------------------------------------------- controller signals
    def _local_ranks(self, faults: dict[int, int]) -> list[int]:
        return sorted(self._local_of[g] for g in faults if g in self._local_of)

    def _on_stop(self, sig: Any) -> None:
        for global_rank, fault_type in sig.fault_ranks.items():
            self._round_faults.setdefault(global_rank, fault_type)
        if self._round_started is None:
            self._round_started = time.monotonic()
        ranks = [self.ranks[lr] for lr in self._local_ranks(sig.fault_ranks)]
        self._stop_ranks(ranks, graceful=False)
        self._mgr.report_stop_complete(Code.OK, "", sig.fault_ranks)

    def _on_strategies(self, sig: Any) -> None:
        self._mgr.report_recover_strategy(sig.fault_ranks, self.config.offered_strategies)

    def _on_change(self, sig: Any) -> None:
        strategy = sig.strategy
        faults = sig.fault_ranks or dict(self._round_faults)
        started = self._round_started or time.monotonic()
        log.info("strategy: %s for rank(s) %s", strategy, sorted(faults))
        if strategy in (Strategy.RECOVER, Strategy.JOB_RESCHEDULING):
            self._restart(strategy, faults, started)
        elif strategy == Strategy.DUMP:
            self._on_dump(sig)
        elif strategy == Strategy.EXIT:
            why = _reason(sig)
            if why:
                log.warning("the controller ends the job: %s", why)
            self._stop_ranks(list(self.ranks.values()), graceful=True)
            self._mgr.report_recover_status(Code.OK, "", faults, strategy)
            self._finish(False, self._failure_code(), f"the controller chose exit{': ' + why if why else ''}")
        else:
            log.warning("strategy %r is not one this agent carries out", strategy)
            self._mgr.report_recover_status(Code.RETRY_FAILED_UNRECOVERABLE, f"unsupported strategy {strategy}",
                                            faults, strategy)

    def _on_dump(self, sig: Any) -> None:
        """Ask every healthy rank to save at its next step boundary, wait (bounded), then stop the job."""
        faults = sig.fault_ranks or dict(self._round_faults)
        budget = self.config.dump_timeout
        if sig.timeout and sig.timeout > 0:
            budget = min(budget, max(1.0, sig.timeout * 0.8))
        requests = {}
        unsaved = []
        for rank in self.ranks.values():
            if rank.state != RUNNING:
                continue
            hb, _ = self._heartbeat(rank)
            if hb is None:
                unsaved.append(rank.global_rank)
                continue
            requests[rank.global_rank] = (hb, hb.request_save())
        log.info("dump: asked rank(s) %s to save (up to %.0fs)", sorted(requests), budget)
        deadline = time.monotonic() + budget
        saved = []
        for global_rank, (hb, number) in sorted(requests.items()):
            state = hb.wait_save(number, max(0.0, deadline - time.monotonic()))
            (saved if state is not None and state.save_ok else unsaved).append(global_rank)
        self._stop_ranks(list(self.ranks.values()), graceful=True)
        msg = f"saved: {sorted(saved)}; not saved: {sorted(unsaved)}"
        log.info("dump: %s", msg)
        code = Code.OK if saved and not unsaved else Code.DUMP_FAILED
        if self._mgr is not None:
            self._mgr.report_recover_status(code, msg, faults, Strategy.DUMP)
        self._finish(False, self._failure_code(), f"dumped ({msg})")

    def _on_kill(self, sig: Any) -> None:
        why = _reason(sig)
        log.warning("controller sent %s%s: stopping every rank", sig.signal_type or sig.actions,
                    f" ({why})" if why else "")
        self._finish(False, self._failure_code(), f"controller sent {sig.signal_type}{': ' + why if why else ''}")

    def _recovered(self, strategy: str, ranks: list[int], started: float, degraded: bool = False) -> None:
        seconds = time.monotonic() - started
        self.result.recoveries.append(RecoveryRecord(strategy, ranks, time.time(), seconds, degraded))
        pids = ", ".join(f"{self.ranks[self._local_of[g]].global_rank}:{self.ranks[self._local_of[g]].pid}"
                         for g in ranks if g in self._local_of)
        log.info("recovered rank(s) %s with %s in %.3fs%s", ranks, strategy, seconds,
                 f" (now rank:pid {pids})" if pids else "")
        self._round_faults.clear()
        self._round_started = None


def _reason(sig: Any) -> str:
    """taskd's controller says why it ends a job in extraParams {"reason": ...}; ClusterD sends other JSON."""
    import json

    try:
        params = json.loads(sig.extra_params or "{}")
    except (TypeError, ValueError):
        return ""
    return str(params.get("reason", "")) if isinstance(params, dict) else ""


__all__ = ["LauncherDetails", "Supervisor"]


def _file_size(path: str | None) -> int | None:
    try:
        return os.path.getsize(path) if path else None
    except OSError:
        return None


def _wait_for_dump(path: str | None, before: int | None, limit: float = 3.0, quiet: float = 0.2) -> None:
    """Give faulthandler's dump time to reach the rank's log before the rank is killed.

    The dump is written from a C signal handler and copied by whoever drains the rank's
    output, so a fixed pause can lose it on a loaded machine: wait until the log grew and then
    stayed still for `quiet` seconds (at most `limit`); without a log to watch, a short pause.
    """
    if before is None:
        time.sleep(0.3)
        return
    deadline = time.monotonic() + limit
    size, still_since = before, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = _file_size(path)
        if now_size is None:
            return
        if now_size != size:
            size, still_since = now_size, time.monotonic()
        elif size > before and still_since is not None and time.monotonic() - still_since >= quiet:
            return
