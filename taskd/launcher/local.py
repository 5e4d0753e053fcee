"""LocalLauncher: the four msrun callbacks, implemented with real processes on this node.

Vocabulary: a *rank* is a local rank slot (0..nproc_per_node-1); each start of a rank is an *incarnation* (a
process group led by the rank's process). The agent only sees pids and local ranks (the msrun contract).

Orphans: the launcher makes its process a child subreaper, so a rank's descendant that escaped the rank's process
group (setsid/setpgid) is re-parented to us when its parent dies, instead of to init. Such an *orphan* is killed
(with its own descendants) when a rank ends and by close(), unless it still belongs to a running rank; orphans that
exit by themselves are reaped by the I/O thread's tick. Only exact pids are ever reaped, never waitpid(-1): see
docs/launcher.md for the rule.

Threading: call the spawning callbacks (START_ALL_WORKER, START_WORKER_LIST) from a thread that lives as long as
the agent (PR_SET_PDEATHSIG fires when the spawning *thread* exits). All methods are thread-safe.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from taskd.callbacks import STATUS_NOT_STARTED
from taskd.launcher.env import OMP_DEFAULT, OMP_WARNING, omp_default, rank_env
from taskd.launcher.error_file import RankError, read_error_file
from taskd.launcher.incarnation import SPAWN_FAILED_CODE, Incarnation, RankTable
from taskd.launcher.node_files import fresh_rank_files, open_node_files, rank_log_path, safe_name, set_node_count
from taskd.launcher.orphans import OrphanKeeper
from taskd.launcher.output import ERR, OUT, OutputPump, RankOutput
from taskd.launcher.ports import node_master_port
from taskd.launcher.reaping import Reaper
from taskd.launcher.snapshots import Persistence, SnapshotArea
from taskd.launcher.spares import SparePool
from taskd.launcher.spec import WorkerSpec
from taskd.launcher.successors import Successors
from taskd.process.run_dir import make_run_dir
from taskd.process.spawn import has_exited, kill_group, spawn
from taskd.process.subreaper import escaped_descendants, send_signal
from taskd.rendezvous import StoreHostError
from taskd.worker.env import Var

log = logging.getLogger(__name__)

ORPHAN_TICK = 5.0  # seconds between looks for orphans that exited by themselves (a look costs an idle agent ~0.3 ms)

__all__ = ["SPAWN_FAILED_CODE", "Incarnation", "LocalLauncher", "ORPHAN_TICK"]


class LocalLauncher:
    """Starts, watches and stops the ranks of one node; see :meth:`callbacks` for the msrun contract.

    Beyond the callbacks it is the agent's `Launcher` (taskd/agent/ranks/launcher.py, checked by
    tests/unit/agent/ranks/test_launcher_api.py): keep the two in step.
    """

    rank_files = True  # each rank's heartbeat and log file is named here (heartbeat_path, log_path)
    # a planned migration's successor (launcher/successors.py): a warm spare bound to a running rank, then adopted
    prepare_successor, adopt_successor = Successors.prepare_successor, Successors.adopt_successor
    discard_successor = Successors.discard_successor
    set_node_count = set_node_count  # a `--nnodes MIN:MAX` job's nodes now: the next ranks' WORLD_SIZE (node_files.py)

    def __init__(self, spec: WorkerSpec, on_exit: Callable[[int, int, int], None] | None = None, *,
                 subreaper: bool = True, orphan_tick: float = ORPHAN_TICK) -> None:
        """``on_exit(local_rank, pid, returncode)`` is called from the I/O thread when a rank's process ends.

        ``orphan_tick``: seconds between looks for orphans that exited by themselves (to reap them).

        ``subreaper=False`` is for embedders that start children of their own, in
        sessions of their own, in this process: the launcher then never becomes a
        subreaper and never touches a process it did not start (escaped orphans go
        to init and live on, as before).
        """
        self._own_run_dir = spec.run_dir is None
        log_dir = spec.log_dir
        if log_dir is None and spec.redirects_any():  # as torchrun: redirected output goes to a kept temp dir
            log_dir = tempfile.mkdtemp(prefix=f"taskd-{safe_name(spec.job_id)}-logs-")
            log.warning("--redirects/--tee without --log-dir: rank logs go to %s", log_dir)
        elif log_dir:
            os.makedirs(log_dir, exist_ok=True)
        persist = Persistence(os.fspath(spec.snapshot_persist_dir), spec.snapshot_persist_every,
                              spec.snapshot_persist_keep) if spec.snapshot_persist_dir else None
        port, self._port_hold = node_master_port(spec)  # node 0 holds it for the job's life (launcher/ports.py)
        self.snapshots = SnapshotArea(safe_name(spec.job_id), spec.nproc_per_node, {**os.environ, **spec.extra_env},
                                       memory=spec.snapshot_memory, persist=persist, nodes=spec.nnodes)
        # (made after the port's check, so that a port in use, MasterPortBusy, leaves no snapshot directory behind)
        run_dir = spec.run_dir or make_run_dir(safe_name(spec.job_id))  # removes those SIGKILLed agents left
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        try:
            logs, live = open_node_files(dataclasses.replace(spec, run_dir=run_dir, master_port=port, log_dir=log_dir))
        except (OSError, StoreHostError, ValueError):
            if spec.run_dir is None:
                shutil.rmtree(run_dir, ignore_errors=True)
            self.snapshots.close()
            if self._port_hold is not None:
                self._port_hold.close()
            raise
        self.spec = dataclasses.replace(spec, run_dir=run_dir, master_port=live.port, log_dir=log_dir)
        if omp_default(self.spec):
            log.warning(OMP_WARNING, OMP_DEFAULT)
        self._on_exit = on_exit
        self._lock = threading.RLock()
        self._closed = False
        self._table = RankTable(spec.nproc_per_node)
        self._logs = logs
        self._job_restarts: int | None = None  # set by the agent: see set_restart_count
        self._restart_rounds = 0  # START calls that restarted something: the count when nobody sets one
        self._pump = OutputPump(tick=(lambda: self._reaper.sweep_exited_orphans()) if subreaper else None,
                                tick_interval=orphan_tick)
        self._live = live  # node 0 hosts the store that outlives every rank; ranks get the control file
        # any entrypoint (a .py script, -m module, --no-python program) may declare what its ranks can do in
        # place (taskd.worker): the agent offers recover only to ranks that declared it (docs/worker.md), so an
        # undeclared DDP script gets job-rescheduling, never a replacement waiting forever for its old peers
        self.rank_declarations = True
        self._generation = 0  # the group generation ranks started from now on join (set_generation)
        self._spares = SparePool.for_spec(spec, self._live.enabled)
        self._standby = spec.node_rank is None  # a standby's first ranks come from its spares, warmed meanwhile
        if self._standby:
            self._spares.fill()  # pre-import the framework (TASKD_PREIMPORT) before any node is assigned
        self._orphans = OrphanKeeper(self._lock, lambda: self._table.unreaped_pids() | set(self._spares.pids())
                                     | self._live.pids(),
                                     lambda: self._table.running_marks(self.heartbeat_path),
                                     self._pump.add_exit_watch, Var.TASKD_HEARTBEAT_FILE)
        self._reaper = Reaper(self._lock, self._orphans, lambda: self._closed)
        if subreaper:
            self._orphans.acquire()  # last: close() releases it

    # -- msrun callbacks ---------------------------------------------------------------------
    def callbacks(self) -> dict[str, Callable[..., object]]:
        """The four callbacks under msrun's names, ready for ``MSRunPlugin.register_callbacks``."""
        return {
            "KILL_WORKER": self.kill_worker,
            "START_ALL_WORKER": self.start_all_worker,
            "START_WORKER_LIST": self.start_worker_list,
            "MONITOR": self.monitor}

    def kill_worker(self, pids: list[int]) -> int:
        """SIGKILL the process group of each listed worker pid (``[-1]``: every live worker); returns 0.

        Asynchronous like msrun's: the processes are gone a moment later, not
        necessarily when this returns. Unknown pids are logged and ignored.
        """
        _require_list("KILL_WORKER", pids)
        with self._lock:
            live = {inc.pid: inc for inc in self._table.running()}
            if list(pids) == [-1]:
                targets = list(live.values())
            else:
                targets = []
                for pid in pids:
                    if pid in live:
                        targets.append(live[pid])
                    else:
                        log.warning("KILL_WORKER: pid %s is not a live worker of this launcher", pid)
            for inc in targets:
                log.info("killing rank %d (pid %d) and its process group", inc.global_rank, inc.pid)
                kill_group(inc.pid)  # type: ignore[arg-type]
                inc.killed = True
        return 0

    def start_all_worker(self) -> int:
        """Kill every live worker, then start every local rank; 0 if all are running right after, else 1."""
        self._check_open()
        self.spec.global_rank(0)  # a standby not yet assigned a node raises here
        with self._lock:
            live = self._table.running()
            for inc in live:
                kill_group(inc.pid)  # type: ignore[arg-type]
            self._spares.discard()  # every rank restarts into a fresh group: a prepared replacement joins none
            for inc in live:
                self._reaper.wait(inc, timeout=10.0)
            restarted = any(self._table.starts(r) for r in range(self.spec.nproc_per_node))
            self._restart_rounds += restarted
            try:  # the store child starts with the ranks, not before them: they need it only at init_process_group
                self._live.start()
            except StoreHostError as exc:
                log.error("%s", exc)
                return 1
            ok = [self._start(r) for r in range(self.spec.nproc_per_node)]
            try:
                self._live.confirm()
            except StoreHostError as exc:
                log.error("%s", exc)
                return 1
            self._spares.refill_later() if restarted else self._spares.fill()  # a restart's spare: after it
        return 0 if all(ok) else 1

    def start_worker_list(self, ranks: list[int]) -> int:
        """Start a fresh process for each listed local rank; 0 if all are running right after, else 1.

        Like msrun, a still-running incarnation is not killed first (the agent
        stops faulty ranks before restarting them); it is still tracked, so
        ``kill_worker([-1])`` and ``close()`` stop it. One that KILL_WORKER
        already signalled is first waited for (up to 5 s), so incarnations of a
        rank never overlap after a kill.
        """
        _require_list("START_WORKER_LIST", ranks)
        self._check_open()
        self.spec.global_rank(0)  # a standby not yet assigned a node raises here
        ok = True
        with self._lock:
            if any(self._table.valid(r) and self._table.starts(r) for r in ranks):
                self._restart_rounds += 1
            for rank in ranks:
                if not self._table.valid(rank):
                    log.error("START_WORKER_LIST: %r is not a local rank (0..%d)", rank, self.spec.nproc_per_node - 1)
                    ok = False
                    continue
                current = self._table.current(rank)
                if current is not None and current.killed:
                    self._reaper.wait(current, timeout=5.0)  # SIGKILLed a moment ago: it dies within ms
                if current is not None and current.running and not self._reaper.reap(current):
                    log.warning("START_WORKER_LIST: rank %d (pid %d) is still running", current.global_rank,
                                current.pid)
                ok = self._start(rank) and ok
            self._spares.refill_later()
        return 0 if ok else 1

    def monitor(self, ranks: list[int]) -> dict[int, dict[str, object]]:
        """msrun's MONITOR: ``{local_rank: {"pid", "status", "global_rank", "local_rank", "node_id"}}``.

        status: None running, 0 exited 0, 300 ended any other way, 200 never
        started (then the entry is only ``pid``, ``status``, ``global_rank``).
        Ranks that are not local ranks of this node are left out.
        """
        _require_list("MONITOR", ranks)
        if self.spec.node_rank is None:  # a standby not yet assigned a node has no rank to tell of
            return {}
        with self._lock:
            wanted = range(self.spec.nproc_per_node) if list(ranks) == [-1] else ranks
            result: dict[int, dict[str, object]] = {}
            for rank in wanted:
                if not self._table.valid(rank):
                    continue
                global_rank = self.spec.global_rank(rank)
                inc = self._table.current(rank)
                if inc is None:
                    result[rank] = {"pid": None, "status": STATUS_NOT_STARTED, "global_rank": global_rank}
                    continue
                if inc.running:
                    self._reaper.reap(inc)
                result[rank] = {"pid": inc.pid, "status": inc.status, "global_rank": global_rank, "local_rank": rank,
                                "node_id": self.spec.node_rank}
            return result

    # -- accessors for the agent -------------------------------------------------------------
    def returncode(self, local_rank: int) -> int | None:
        """Exit code of the rank's current incarnation as Popen gives it (-N for signal N); None if running."""
        with self._lock:
            inc = self._table.current(local_rank)
            if inc is None:
                return None
            if inc.running:
                self._reaper.reap(inc)
            return inc.returncode

    def pid(self, local_rank: int) -> int | None:
        with self._lock:
            inc = self._table.current(local_rank)
            return inc.pid if inc is not None else None

    def restart_count(self, local_rank: int) -> int:
        """How many times the rank's current incarnation was preceded by another (0 before any restart)."""
        with self._lock:
            return max(0, self._table.starts(local_rank) - 1)

    def set_restart_count(self, count: int) -> None:
        """The job-wide restart count that ranks started from now on get as TORCHELASTIC_RESTART_COUNT
        and TASKD_RESTART_COUNT (the same on every rank; without it TASKD_RESTART_COUNT is the rank's own).

        The agent calls this before START_ALL_WORKER/START_WORKER_LIST, since it knows the
        job's count (every node's restarts, from the controller); without it, the launcher
        counts its own START calls that restarted something, which is job-wide on one node.
        """
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"set_restart_count takes an integer >= 0, got {count!r}")
        with self._lock:
            self._job_restarts = count

    # whether ranks run with live recovery (an agent-side store, a control file): see taskd.rendezvous
    live_recovery = property(lambda self: self._live.enabled)

    def control_path(self) -> str | None:
        """The node's live-recovery control file (TASKD_CONTROL_FILE), None when live recovery is off."""
        return self._live.control_path

    def set_generation(self, generation: int) -> None:
        """The group generation ranks started from now on join (TASKD_GENERATION): the agent's round."""
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise ValueError(f"set_generation takes an integer >= 0, got {generation!r}")
        with self._lock:
            self._generation = generation

    def set_node_rank(self, node_rank: int | None) -> None:
        """A standby's node rank, given once the controller assigned it, while no rank runs: from now on every
        rank's variables (RANK, GROUP_RANK, MS_NODE_ID, ...), log file and heartbeat file are node ``node_rank``'s,
        and node 0 hosts the store. None: no node (an agent that yields its node, or a standby whose node migration
        was called off: it no longer listens on node 0's store port); ranks stopped before stay the old node's."""
        if node_rank is not None and (not isinstance(node_rank, int) or isinstance(node_rank, bool)
                                      or not 0 <= node_rank < self.spec.nnodes):
            raise ValueError(f"set_node_rank takes a node rank in [0, {self.spec.nnodes}), got {node_rank!r}")
        with self._lock:
            self._check_open()
            if node_rank == self.spec.node_rank:
                return
            if any(self._table.starts(r) for r in range(self.spec.nproc_per_node)):  # stopped: a new node's history
                self._table = self._table.fresh_if_idle(lambda inc: self._reaper.wait(inc, timeout=5.0))
            spec = dataclasses.replace(self.spec, node_rank=node_rank)
            logs, live = open_node_files(spec)
            old_logs, old_live = self._logs, self._live
            self.spec, self._logs, self._live = dataclasses.replace(spec, master_port=live.port), logs, live
        for rank_log in old_logs.values():
            rank_log.close()
        old_live.close()
        if node_rank is not None:
            log.info("this node is now node %d (global ranks %s)", node_rank,
                     [spec.global_rank(r) for r in range(spec.nproc_per_node)])

    def log_path(self, local_rank: int) -> str | None:
        return rank_log_path(self.spec.log_dir, self.spec, local_rank) if self._table.valid(local_rank) else None

    def error_file_path(self, local_rank: int) -> str:
        """The rank's TORCHELASTIC_ERROR_FILE, in the private run directory (see taskd.launcher.error_file)."""
        return os.path.join(self.spec.run_dir or "", f"rank_{self.spec.global_rank(local_rank)}.error.json")

    def error_report(self, local_rank: int) -> RankError | None:
        """What the rank's current incarnation recorded with torch's ``@record`` before dying, else None.

        The agent shows it first, as the root cause. The file is removed before each start, so
        what is found belongs to the current incarnation.
        """
        if not self._table.valid(local_rank):
            return None
        return read_error_file(self.error_file_path(local_rank))

    def heartbeat_path(self, local_rank: int) -> str:
        return os.path.join(self.spec.run_dir or "", f"rank_{self.spec.global_rank(local_rank)}.hb")

    def tail_log(self, local_rank: int, n: int = 20) -> list[str]:
        """The last ``n`` output lines of the rank's current incarnation (e.g. its traceback)."""
        with self._lock:
            inc = self._table.current(local_rank)
        if inc is None:
            return []
        if inc.popen is not None and not inc.running:
            inc.output.done.wait(3.0)  # let the I/O thread copy what the process wrote last (slow when loaded)
        return list(inc.output.tail)[-n:] if n > 0 else []

    # -- shutdown ----------------------------------------------------------------------------
    def close(self, grace: float = 5.0) -> None:
        """SIGTERM every rank's group and every orphan, wait up to ``grace``, SIGKILL what is left, reap; idempotent.

        With the subreaper on, nothing the ranks started is left afterwards, not even a zombie.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = self._table.running()
            # Escapees of live ranks get the SIGTERM and grace too; they become orphans as their ranks die.
            orphans = self._orphans
            escaped = [p for inc in live if inc.pid is not None for p in escaped_descendants(inc.pid)] \
                if orphans.active else []
            for inc in live:
                kill_group(inc.pid, signal.SIGTERM)  # type: ignore[arg-type]
            for proc in escaped:
                send_signal(proc, signal.SIGTERM)
            if orphans.active:
                orphans.sweep(signal.SIGTERM, everyone=True)
            deadline = time.monotonic() + max(0.0, grace)
            for inc in live:
                self._reaper.wait(inc, timeout=max(0.0, deadline - time.monotonic()))
            if orphans.active:  # orphans now include the escapees of the ranks that just died
                orphans.wait_gone(orphans.sweep(None), deadline)
            for inc in live:
                if inc.running:
                    log.info("rank %d (pid %d) did not stop within %.1fs: SIGKILL", inc.global_rank, inc.pid, grace)
                    kill_group(inc.pid)  # type: ignore[arg-type]
            for inc in live:
                self._reaper.wait(inc, timeout=10.0)
        self._spares.close()
        self._live.close()
        if self._port_hold is not None:
            self._port_hold.close()
        if self._orphans.active:
            with self._lock:
                self._orphans.kill_all(timeout=10.0)
            self._orphans.release()
        self._pump.close()
        for rank_log in self._logs.values():
            rank_log.close()
        if self._own_run_dir and self.spec.run_dir:
            shutil.rmtree(self.spec.run_dir, ignore_errors=True)
        self.snapshots.close()  # every rank is gone: nothing of the job's stays in /dev/shm

    def __enter__(self) -> LocalLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the launcher is closed")

    def _env(self, rank: int, job_restarts: int) -> dict[str, str]:
        """``rank``'s next incarnation's variables; once the agent gives the job-wide restart count, its
        TASKD_RESTART_COUNT is that count too (the same on every rank)."""
        own = self._table.starts(rank) if self._job_restarts is None else job_restarts
        env = rank_env(self.spec, rank, own, self.heartbeat_path(rank), job_restart_count=job_restarts,
                       error_file=self.error_file_path(rank))
        env.update(self._live.env(self._generation))
        env.update(self.snapshots.env())
        return env

    def prepare_replacement(self, local_rank: int, after_generation: int) -> bool:
        """A warm spare becomes the dead ``local_rank`` now, before the round decides: it runs the script meanwhile
        and, in `LiveGroup()`, waits for a generation above ``after_generation`` (TASKD_JOIN_AFTER). The rank's START
        adopts it if its variables are what that START gives (but the generation), else discards it."""
        with self._lock:
            current = self._table.current(local_rank) if self._table.valid(local_rank) else None
            out, err = self.spec.console_streams(local_rank) if current is not None else (None, None)
            if self._closed or not self._live.enabled or self._standby or current is None \
                    or not self._reaper.reap(current) or out != err or not self._spares.ready():  # reap: seen first?
                return False
            # the count this START will carry: the agent's job-wide count set for the round (one more), else ours
            job_restarts = self._restart_rounds + 1 if self._job_restarts is None else self._job_restarts + 1
            env = {**self._env(local_rank, job_restarts), Var.TASKD_JOIN_AFTER: str(after_generation)}
            fresh_rank_files(self.heartbeat_path(local_rank), self.error_file_path(local_rank))
            if not self._spares.bind(local_rank, self.spec.entrypoint, env, self.spec.cwd):
                return False
        log.info("live recovery: rank %d's replacement prepared from a warm spare", self.spec.global_rank(local_rank))
        return True

    def discard_prepared(self) -> None:
        """The round starts no replacement into a rejoin (job-rescheduling, a resize, the end): the prepared ones (and
        a migration's successor) are killed and reaped now, before any control file names them a generation."""
        with self._lock:
            self._spares.discard()

    def _start(self, rank: int) -> bool:
        """Spawn one incarnation of ``rank`` (or adopt the replacement prepared for it); True if it runs right after."""
        spec = self.spec
        global_rank = spec.global_rank(rank)
        restart = self._table.starts(rank)
        job_restarts = self._restart_rounds if self._job_restarts is None else self._job_restarts
        env = self._env(rank, job_restarts)
        rank_log = self._logs[rank]
        out, err = spec.console_streams(rank)
        output = RankOutput(rank_log, f"[rank{global_rank}]: ", out, err, split=out != err)
        try:
            popen = self._spares.take(rank, env)
            if popen is None:
                fresh_rank_files(self.heartbeat_path(rank), self.error_file_path(rank))
                popen = self._spares.activate(spec.entrypoint, env, spec.cwd) \
                    if (restart or self._standby) and not output.split else None
            if popen is None:
                popen = spawn(spec.entrypoint, env, cwd=spec.cwd, split_stderr=output.split)
        except (OSError, subprocess.SubprocessError) as exc:
            inc = Incarnation(rank, global_rank, restart, None, output, returncode=SPAWN_FAILED_CODE,
                              error=f"{type(exc).__name__}: {exc}")
            self._table.append(inc)
            rank_log.write(inc.header().encode())
            output.note(f"taskd: cannot start rank {global_rank}: {inc.error}")
            output.finish(OUT)
            output.finish(ERR)
            log.error("cannot start rank %d: %s", global_rank, inc.error)
            return False
        inc = Incarnation(rank, global_rank, restart, popen, output)
        self._table.append(inc)
        rank_log.write(inc.header().encode())
        assert popen.stdout is not None
        self._pump.add_stream(popen.stdout, output.sink(OUT))
        if popen.stderr is not None:
            self._pump.add_stream(popen.stderr, output.sink(ERR))
        self._pump.add_exit_watch(popen.pid, lambda: self._on_process_exit(inc))
        log.debug("started rank %d (local %d) pid %d, restart %d", global_rank, rank, popen.pid, restart)
        return not has_exited(popen.pid)

    def _on_process_exit(self, inc: Incarnation) -> None:
        """I/O thread: the rank's process ended; reap it at once so no zombie stays behind."""
        with self._lock:
            if not self._reaper.reap(inc):
                return
        if self._on_exit is not None and inc.pid is not None and inc.returncode is not None:
            try:
                self._on_exit(inc.local_rank, inc.pid, inc.returncode)
            except Exception:
                log.exception("on_exit callback failed")


def _require_list(name: str, value: object) -> None:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} takes a list of ints, got {type(value).__name__}")
