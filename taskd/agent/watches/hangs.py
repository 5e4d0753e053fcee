"""Hangs: each rank's heartbeat file (`taskd.worker.heartbeat()`), judged on the slow sweep (a stopped rank
once the agent's looks have seen it stopped for STOPPED_AFTER s), and the hung rank's Python stacks put in
its log before it is killed (py-spy when installed, else faulthandler).

In a collective job every rank stops beating when one hangs: the others wait for it inside a
collective. Only the *culprit* is flagged (`HangWatch.culprits`, deciding with `taskd.agent.watches.culprit`):
a stopped process (SIGSTOP), a stale rank not inside a collective by its markers (taskd.worker.live),
one whose last heartbeat is at an earlier step than the others', or, when all stopped at the same step,
the one whose stacks stop in the script's own code while the others' stop inside the framework;
otherwise the console says it cannot tell which rank. Stacks are taken from every stale rank at once,
with a bound, and a stack that could not be taken (a stopped process never runs its signal handler) is
said so on the console.

Under taskd's launcher every rank is told its own heartbeat file; under msrun no callback takes
per-rank variables, so the agent exports one directory (TASKD_HEARTBEAT_DIR) that ranks inherit and
name their file in.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import psutil

from taskd.agent.ranks.launcher import Launcher
from taskd.agent.ranks.table import Rank
from taskd.agent.watches.culprit import (
    STOPPED_AFTER,
    AutoTimeout,
    StopLooks,
    Suspect,
    collective_timeout,
    decide,
    stall_in_sight,
    waits_in_framework,
)
from taskd.process.run_dir import make_run_dir
from taskd.settings import default, env_text
from taskd.worker.env import Var
from taskd.worker.heartbeat_file import FINISHING_DONE, HeartbeatFile, HeartbeatFileError, HeartbeatState
from taskd.worker.live import Phase, read_rank_status

STACKS_BOUND = 5.0  # seconds for taking every stale rank's stacks, in parallel
IDLE_SHARE = 0.2  # of one CPU: a rank using less since its last step does nothing (derived timeout only)
EXIT_WAITED = 5.0  # a rank that exits this long after its last heartbeat (and 3 of its steps) waited on a peer

log = logging.getLogger("taskd.agent")


@dataclass(frozen=True)
class Hang:
    """A rank that made no progress for longer than allowed."""

    quiet: float  # seconds since its last sign of progress
    step: int | None
    section: str
    stack_signal: int  # what the rank installed faulthandler on (0: none)
    waiting: bool = False  # inside a collective (or paused for a rebuild), waiting on others: not the culprit

    def describe(self) -> str:
        step = f" at step {self.step}" if self.step is not None else ""
        where = f" in section {self.section!r}" if self.section else ""
        return f"last heartbeat {self.quiet:.1f}s ago{step}{where}"


class HangWatch:
    """The heartbeat files of one node's ranks: read on the sweep, reset for each new incarnation."""

    def __init__(self, details: Launcher, timeout: float | None, worker_log: Callable[[Rank], str | None],
                 auto: bool = False, environ: Mapping[str, str] = os.environ) -> None:
        """`auto`: with no `timeout`, derive one from the ranks' step times (msrun: culprit.AutoTimeout)."""
        self.details = details  # taskd's launcher names each rank's file; msrun does not
        self.timeout = timeout
        collective = collective_timeout(environ)
        self.auto = AutoTimeout(cap=collective / 2 if collective else None) if auto and timeout is None else None
        self._worker_log = worker_log
        self._files: dict[int, HeartbeatFile] = {}
        self._dir: str | None = None
        self._dumps: dict[int, str] = {}  # pid -> its stacks as taken for a hang (each incarnation once)
        self._warned_silent = False
        self._cpu: dict[int, tuple[int | None, float | None, float]] = {}  # pid -> (step, CPU s, when) (_busy)
        self.stops = StopLooks()  # the running ranks' process states, looked at every STOP_LOOK s (`look`)

    def export_dir(self, parent: str | None = None) -> None:
        """Under msrun, give the ranks (through our environment) a directory to write their heartbeat files in.

        Made whatever the settings: the beats are read for hang detection (on by default under msrun), save
        requests, the metrics and the time training resumed. In `parent` (msrun's --log_dir) when given, else
        the temp directory. It records its owner (msrun's pid), so a
        later agent removes it should msrun be SIGKILLed; this one first removes those of dead owners.
        """
        if self.details.rank_files or os.environ.get(Var.TASKD_HEARTBEAT_DIR):
            self._dir = None if self.details.rank_files else os.environ.get(Var.TASKD_HEARTBEAT_DIR)
            return
        for where in dict.fromkeys((parent or None, None)):  # msrun's --log_dir, else (or if it fails) $TMPDIR
            try:
                if where:
                    os.makedirs(where, exist_ok=True)
                self._dir = make_run_dir("heartbeat", where)
                break
            except OSError as exc:
                log.warning("cannot make a heartbeat directory in %s: %s", where or tempfile.gettempdir(), exc)
        if self._dir is not None:
            os.environ[Var.TASKD_HEARTBEAT_DIR] = self._dir

    @property
    def effective(self) -> float | None:
        """The timeout in force: the one set, else the one derived from the step times (None: not yet, or off)."""
        if self.timeout is not None:
            return self.timeout
        return self.auto.value if self.auto is not None else None

    @property
    def on(self) -> bool:
        """Hang detection is on: a timeout was set, or one is derived (msrun)."""
        return self.timeout is not None or self.auto is not None

    def files_dir(self) -> str | None:
        """The directory of the ranks' heartbeat files: the launcher's run directory, or the one exported here."""
        if self.details.rank_files:
            path = self.details.heartbeat_path(0)
            return os.path.dirname(path) if path else None
        return self._dir

    def look(self, ranks: Iterable[Rank], now: float) -> bool:
        """Look at the running ranks' process states (monotonic `now`); True when one has been stopped long
        enough to be judged now rather than on the next sweep."""
        return self.on and self.stops.look([(r.local_rank, r.pid) for r in ranks if r.pid and _stopped(r)], now)

    def _busy(self, rank: Rank, step: int | None, now: float) -> bool:
        """Whether the rank used CPU (IDLE_SHARE of the time) since the first sweep that found it still at its
        last step: a derived timeout (no setting) is only applied to a rank that does nothing, not to one busy
        with a long save outside a section. A hung rank waits (a lock, a socket, a sleep) or is stopped. A rank
        that advances between sweeps costs no CPU read; the baseline is taken one sweep after its last step."""
        seen = self._cpu.get(rank.pid)
        if seen is None or seen[0] != step:
            self._cpu[rank.pid] = (step, None, now)
            return True
        try:
            cpu = sum(rank.proc.cpu_times()[:2]) if rank.proc is not None else None
        except psutil.Error:
            return False
        if cpu is None:
            return False
        if seen[1] is None:
            self._cpu[rank.pid] = (step, cpu, now)
            return True
        return cpu - seen[1] > IDLE_SHARE * (now - seen[2])

    def reset(self, ranks: Iterable[Rank]) -> None:
        """A fresh incarnation must not inherit its predecessor's last heartbeat (our launcher does this itself)."""
        ranks = list(ranks)
        if self.auto is not None:
            for rank in ranks:
                self.auto.forget(rank.global_rank)
            self._cpu.clear()
        if self._dir is None:
            return
        for rank in ranks:
            try:
                HeartbeatFile(os.path.join(self._dir, f"rank_{rank.global_rank}.hb")).create()
            except OSError as exc:
                log.debug("cannot reset heartbeat file of rank %d: %s", rank.local_rank, exc)

    def forget(self, local_rank: int) -> None:
        """Drop the rank's cached mapping: its heartbeat file was replaced by another (a migration's successor's)."""
        cached = self._files.pop(local_rank, None)
        if cached is not None:
            cached.close()

    def heartbeat(self, rank: Rank) -> tuple[HeartbeatFile | None, HeartbeatState | None]:
        """(the rank's heartbeat file, its current state), or (None, None) when it has none it attached to."""
        if self.details.rank_files:
            path = self.details.heartbeat_path(rank.local_rank)
        elif self._dir is not None:  # a missing file fails read() below: no stat every sweep
            path = os.path.join(self._dir, f"rank_{rank.global_rank}.hb")
        else:
            return None, None
        if not path:
            return None, None
        cached = self._files.get(rank.local_rank)
        if cached is None or cached.path != str(path):
            cached = HeartbeatFile(path)
            self._files[rank.local_rank] = cached
        try:
            state = cached.read()
        except (HeartbeatFileError, OSError, ValueError):
            return None, None
        return (cached, state) if state.pid == rank.pid else (None, None)

    def check(self, rank: Rank, now: float) -> Hang | None:
        """The rank's hang, if its heartbeat (or the section it is in) is past its deadline at wall time `now`."""
        hb, state = self.heartbeat(rank)
        if state is None or hb is None:
            return None
        if state.torn:  # a write left half done: the reader kept the last consistent heartbeat, judged below
            log.debug("rank %d: heartbeat file caught mid-write; using its last consistent state", rank.global_rank)
        if state.finishing:  # exiting (framework finalisation sends no heartbeats): bounded by overdue_exits()
            return None
        busy = False
        if self.auto is not None:
            self.auto.observe(rank.global_rank, state.step, state.time)
            busy = self._busy(rank, state.step, now)
        timeout = self.effective
        deadline = state.deadline(timeout)
        stopped = (self.on and state.time > 0 and now - state.time >= STOPPED_AFTER
                   and self.stops.held(rank.local_rank, rank.pid or 0) >= STOPPED_AFTER and _stopped(rank))
        if not stopped and (deadline is None or now <= deadline):
            return None
        if busy and not stopped and self.timeout is None and not (state.section_start and state.section_timeout):
            log.debug("rank %d: quiet past the derived timeout but using CPU: not judged hung", rank.global_rank)
            return None
        try:
            live = read_rank_status(hb)
            # inside a collective, or paused/rejoining while its group is rebuilt: waiting, not hanging
            waiting = live.can_rejoin and (live.collective_since is not None
                                           or live.phase in (Phase.PAUSED, Phase.REJOINING))
            if not stopped and timeout and live.joined_time and now <= live.joined_time + timeout:
                return None  # just rejoined a rebuilt group: its progress counts from there
        except (HeartbeatFileError, OSError, ValueError):
            waiting = False
        return Hang(now - max(state.time, state.section_start or 0.0), state.step, state.section, state.stack_signal,
                    waiting)

    def said_done(self, rank: Rank) -> bool:
        """Whether the rank's script said its work was done (``taskd.worker.finished()``, ``LiveGroup.close()``)."""
        _, state = self.heartbeat(rank)
        return state is not None and state.finishing == FINISHING_DONE

    def overdue_exits(self, ranks: Iterable[Rank], now: float, grace: float) -> list[tuple[Rank, bool, float]]:
        """Ranks marked finishing (taskd.worker.finished(), or their interpreter's exit) more than the heartbeat
        timeout plus `grace` seconds ago and still running: (rank, whether the script said it was done, seconds).
        None without hang detection: then nothing bounds a rank's exit, as before."""
        if not self.timeout:
            return []
        overdue = []
        for rank in ranks:
            _, state = self.heartbeat(rank)
            if state is not None and state.finishing and state.finishing_since is not None:
                since = now - state.finishing_since
                if since > self.timeout + grace:
                    overdue.append((rank, state.finishing == FINISHING_DONE, since))
        return overdue

    def culprits(self, ranks: Iterable[Rank], now: float) -> tuple[list[tuple[Rank, Hang]], list[tuple[Rank, Hang]]]:
        """(culprits, waiting) among `ranks`: culprits are named on the console first, then killed by the caller.

        The decision is `taskd.agent.watches.culprit.decide` (stopped process, collective markers, the step of the
        last heartbeat, then the stacks, which are taken here when they would decide). When nothing
        decides, every stale rank is returned as a culprit and the console says it cannot tell which.
        Nothing is returned while a peer at the same step still beats: the next sweep judges.
        """
        ranks = list(ranks)
        self._warn_if_nobody_beats(ranks, now)
        if all(self.check(rank, now) is None for rank in ranks):
            return [], []
        seen = [(rank, suspect, hang) for rank in ranks if (found := self._suspect(rank, now)) is not None
                for suspect, hang in (found,)]
        timeout = self.effective or STOPPED_AFTER
        if self.timeout is None and not stall_in_sight([s for _, s, _ in seen], timeout):
            log.debug("hang: a lone quiet rank under the derived timeout: not judged (it may be finishing)")
            return [], []
        # a derived timeout (no setting) never guesses: the ranks may all wait on a busy rank of another node
        return self._judge(seen, timeout, guess=self.timeout is not None)

    def behind_exit(self, exited: Rank, others: Iterable[Rank], now: float) -> list[tuple[Rank, Hang]]:
        """The hung peers that a rank's failed exit followed from, named on the console ("the culprit").

        A rank that waited in a collective until the collective gave up (MindSpore's CPU collectives after
        MS_CPU_COMM_OP_TIMEOUT) exits because a peer hangs: its last heartbeat is several steps old. The peers
        then judged are those as quiet as half its wait, or stopped, by the same decision as a sweep's (with
        their stacks). Empty when hang detection is off, the exit was its own (it was beating), or nothing
        decides: a rank is named only on evidence."""
        if not self.on:
            return []
        _, state = self.heartbeat(exited)
        if state is None or state.time <= 0:  # (its interpreter's exit marked it finishing: no matter)
            return []
        waited = now - max(state.time, state.section_start or 0.0)
        if waited < max(EXIT_WAITED, 3 * (self.auto.slowest if self.auto is not None else 0.0)):
            return []
        seen = [(rank, suspect, hang) for rank in others
                if (found := self._suspect(rank, now, quiet_for=waited / 2)) is not None for suspect, hang in (found,)]
        culprits, _ = self._judge(seen, waited / 2, guess=False,
                                  after=f"rank {exited.global_rank} (pid {exited.pid}) exited after waiting "
                                        f"{waited:.1f}s on it")
        return culprits

    def _judge(self, seen: list[tuple[Rank, Suspect, Hang]], timeout: float, guess: bool = True,
               after: str = "") -> tuple[list[tuple[Rank, Hang]], list[tuple[Rank, Hang]]]:
        """`decide` over what was seen, taking the stacks when they would decide; names the culprits on the
        console. `guess`: when nothing decides, every stale rank is a culprit ("treating every one as hung")."""
        verdict = decide([s for _, s, _ in seen], timeout)
        if verdict.need_stacks:
            self.record_all([(rank, hang) for rank, s, hang in seen if s.stale])
            seen = [(rank, replace(s, in_framework=waits_in_framework(self._dumps.get(rank.pid, "")))
                     if s.stale else s, hang) for rank, s, hang in seen]
            verdict = decide([s for _, s, _ in seen], timeout, stacks_taken=True)
        if verdict.defer or not (verdict.decided or guess):
            log.debug("hang: %s", verdict.reason)
            return [], []
        by_rank = {rank.global_rank: (rank, hang) for rank, _, hang in seen}
        culprits = [by_rank[r] for r in verdict.culprits if r in by_rank]
        waiting = [by_rank[r] for r in verdict.waiting if r in by_rank]
        if not verdict.decided:
            each = "; ".join(f"rank {r.global_rank} (pid {r.pid}) {h.describe()}" for r, h in culprits)
            log.warning("hang: %s (%s): treating every one of them as hung", verdict.reason, each)
            return culprits, []
        for rank, hang in culprits:
            step = f" at step {hang.step}" if hang.step is not None else ""
            where = f" in section {hang.section!r}" if hang.section else ""
            stopped = " (process stopped)" if _stopped(rank) else ""
            log.warning("hang: rank %d (pid %d) made no progress for %.1fs%s%s%s: the culprit; %s%s", rank.global_rank,
                        rank.pid, hang.quiet, step, where, stopped, verdict.reason, f"; {after}" if after else "")
        if waiting and culprits:  # without a culprit (it was just killed) they wait on its replacement: no news
            marked = any(hang.waiting for _, hang in waiting)
            log.info("hang: rank(s) %s wait on it%s", sorted(r.global_rank for r, _ in waiting),
                     " inside a collective" if marked else "")
        return culprits, waiting

    def _warn_if_nobody_beats(self, ranks: list[Rank], now: float) -> None:
        """Hang detection is on but, twice the timeout after the ranks started, none has ever beaten: say so
        once (a script that never calls heartbeat(), or a Model.train without TaskdCallback, is never hung)."""
        if not self.timeout or self._warned_silent or not ranks:
            return
        try:
            started = max(r.proc.create_time() for r in ranks if r.proc is not None)
        except (psutil.Error, ValueError):
            return
        if now - started < 2 * self.timeout or any(self.heartbeat(r)[1] is not None for r in ranks):
            return
        self._warned_silent = True
        log.warning("hang detection is on (heartbeat timeout %.0fs) but no rank has sent a heartbeat in the %.0fs "
                    "since they started, so none can be found hung: call taskd.worker.heartbeat(step) once per "
                    "step, or pass taskd.worker.mindspore.TaskdCallback to Model.train", self.timeout, now - started)

    def _suspect(self, rank: Rank, now: float, quiet_for: float | None = None) -> tuple[Suspect, Hang] | None:
        """What the decision needs of one running rank with a heartbeat file: stale or not, step, quiet. Stale
        means past its deadline (`check`), or, with `quiet_for`, stopped or quiet that long (`behind_exit`)."""
        hb, state = self.heartbeat(rank)
        if hb is None or state is None or state.finishing:
            return None
        stopped = _stopped(rank)
        hang = self.check(rank, now) if quiet_for is None else None
        stale = hang is not None
        if hang is None:  # not past its deadline (yet): described all the same, it may be the stopped culprit
            hang = Hang(now - max(state.time, state.section_start or 0.0), state.step, state.section,
                        state.stack_signal)
            stale = quiet_for is not None and (stopped or hang.quiet >= quiet_for)
        return Suspect(rank=rank.global_rank, stale=stale, step=state.step, quiet=hang.quiet,
                       stopped=stopped, marked=self._declared(rank), waiting=hang.waiting), hang

    def _declared(self, rank: Rank) -> bool:
        hb, _ = self.heartbeat(rank)
        try:
            return hb is not None and read_rank_status(hb).can_rejoin
        except (HeartbeatFileError, OSError, ValueError):
            return False

    def record_all(self, hangs: Iterable[tuple[Rank, Hang]], bound: float = STACKS_BOUND) -> None:
        """Every stale rank's stacks at once, within `bound` seconds; says which could not be taken."""
        results: dict[int, bool] = {}
        threads = []
        for rank, hang in hangs:
            if rank.pid in self._dumps:  # taken a moment ago, to decide the culprit
                continue
            def take(rank: Rank = rank, sig: int = hang.stack_signal) -> None:
                results[rank.global_rank] = self.record_stacks(rank, sig, min(3.0, bound))
            thread = threading.Thread(target=take, name=f"taskd-stacks-{rank.global_rank}", daemon=True)
            thread.start()
            threads.append((rank, thread))
        deadline = time.monotonic() + bound
        for rank, thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            self._dumps.setdefault(rank.pid, "")  # once per incarnation, taken or not
            if not results.get(rank.global_rank, False):
                why = "its process is stopped (SIGSTOP)" if _stopped(rank) else \
                    "it installed no stack signal (taskd.worker.heartbeat) and py-spy is not available or failed" \
                    if not hang_signal(rank, hangs) else f"it did not answer within {bound:.0f}s"
                log.warning("hang: could not take the stacks of rank %d (pid %s): %s", rank.global_rank, rank.pid, why)

    def record_stacks(self, rank: Rank, stack_signal: int, limit: float = 3.0) -> bool:
        """Put the hung rank's Python stacks in its log: py-spy when installed, else faulthandler; True if taken."""
        log_path = self.details.log_path(rank.local_rank)
        pyspy = shutil.which("py-spy") if (env_text("pyspy") or default("pyspy")) != "0" else None
        if pyspy and log_path and (dump := _pyspy_dump(pyspy, rank, log_path)):
            self._dumps[rank.pid] = dump
            return True
        if stack_signal and not _stopped(rank):  # a stopped process runs no handler: the signal would wait for SIGCONT
            log_path = log_path or self._worker_log(rank)
            before = _file_size(log_path)
            try:
                os.kill(rank.pid, stack_signal)
            except ProcessLookupError:
                return False
            if not _wait_for_dump(log_path, before, limit=limit):
                return False
            self._dumps[rank.pid] = _read_from(log_path, before)
            log.info("stacks of rank %d requested with signal %d (see its log)", rank.global_rank, stack_signal)
            return True
        return False

    def close(self) -> None:
        for hb in self._files.values():
            hb.close()
        if self._dir is not None and os.environ.get(Var.TASKD_HEARTBEAT_DIR) == self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            os.environ.pop(Var.TASKD_HEARTBEAT_DIR, None)


def _pyspy_dump(pyspy: str, rank: Rank, log_path: str) -> str:
    """py-spy's dump of the rank, appended to its log; the dump, or "" when none was taken."""
    try:
        out = subprocess.run([pyspy, "dump", "--pid", str(rank.pid)], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(f"--- taskd: stacks of hung rank {rank.global_rank} (py-spy) ---\n")
                fh.write(out.stdout)
            log.info("stacks of rank %d written to %s", rank.global_rank, log_path)
            return out.stdout
        log.debug("py-spy dump failed: %s", out.stderr.strip())
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("py-spy dump failed: %s", exc)
    return ""


def _read_from(path: str | None, offset: int | None, limit: int = 1 << 20) -> str:
    """What the rank's log gained since `offset`: the faulthandler dump (and whatever else it printed meanwhile)."""
    if not path or offset is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def hang_signal(rank: Rank, hangs: Iterable[tuple[Rank, Hang]]) -> int:
    return next((h.stack_signal for r, h in hangs if r is rank), 0)


def _stopped(rank: Rank) -> bool:
    """Whether the rank's process is stopped (SIGSTOP, a debugger): it hangs whatever its heartbeat says."""
    try:
        return rank.proc is not None and rank.proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _file_size(path: str | None) -> int | None:
    try:
        return os.path.getsize(path) if path else None
    except OSError:
        return None


def _wait_for_dump(path: str | None, before: int | None, limit: float = 3.0, quiet: float = 0.2) -> bool:
    """Give faulthandler's dump time to reach the rank's log before the rank is killed.

    The dump is written from a C signal handler and copied by whoever drains the rank's
    output, so a fixed pause can lose it on a loaded machine: wait until the log grew and then
    stayed still for `quiet` seconds (at most `limit`); without a log to watch, a short pause.
    """
    if before is None:
        time.sleep(0.3)
        return True
    deadline = time.monotonic() + limit
    size, still_since = before, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = _file_size(path)
        if now_size is None:
            return False
        if now_size != size:
            size, still_since = now_size, time.monotonic()
        elif size > before and still_since is not None and time.monotonic() - still_since >= quiet:
            return True
    return size > before
