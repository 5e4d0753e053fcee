"""SQLite persistence of the controller: jobs, agents, faults, rounds, strategies and events.

One transaction per handled event that changes what a restart needs, committed before the gRPC
answer goes out, so whatever was answered 0 survives a SIGKILL of the controller (WAL +
synchronous=NORMAL: the commit is in the OS page cache when `commit()` returns; only a power
loss could drop it). Soft history (an agent's stream opened or closed: nothing a restart needs)
is batched by the core and written with the job's next commit or by `commit_soft`.
The job row holds a JSON snapshot of the state machine (`taskd.controller.storage.snapshot`); the other
tables are the history that `taskd status` shows. The file (and SQLite's -wal and -shm files, which
take its mode) is readable by its owner only: it names every job's hosts, pids and faults.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from taskd.controller.clock import identity
from taskd.controller.machine.agents import AgentInfo
from taskd.controller.machine.events import Record
from taskd.controller.machine.job import Job
from taskd.controller.storage.quota import EVENT_ROW, FAULT_ROW, FAULT_ROWS_PER_REPORT
from taskd.controller.storage.snapshot import snapshot
from taskd.controller.storage.stored_rows import agent_problem, snapshot_problem
from taskd.controller.storage.wal_check import wal_refusal

log = logging.getLogger(__name__)

MEMORY = ":memory:"

_UPSERT_JOB = ("INSERT INTO jobs (job_id, state, snapshot, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
               "ON CONFLICT(job_id) DO UPDATE SET state=excluded.state, snapshot=excluded.snapshot, "
               "updated_at=excluded.updated_at")


def _job_row(job: Job, to_wall: Callable[[float], float], sizes: dict[str, int] | None = None) -> tuple[Any, ...]:
    """The jobs row; `sizes` learns the snapshot's length (the job's quota counts it)."""
    text = json.dumps(snapshot(job, to_wall))
    if sizes is not None:
        sizes[job.job_id] = len(text)
    return (job.job_id, job.state.value, text, to_wall(job.created_at), to_wall(job.updated_at))


STATE_FILE_MODE = 0o600
"""The state file and its -wal/-shm companions: owner only (SQLite gives the companions the file's mode)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    job_id TEXT NOT NULL,
    node_rank INTEGER NOT NULL,
    role TEXT, host TEXT, pid INTEGER, ranks_per_node INTEGER,
    registered_at REAL, last_seen REAL,
    finished INTEGER NOT NULL DEFAULT 0, exit_code INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, node_rank)
);
CREATE TABLE IF NOT EXISTS rounds (
    job_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL DEFAULT 0,
    faults TEXT NOT NULL DEFAULT '',
    tried TEXT NOT NULL DEFAULT '[]',
    strategy TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL DEFAULT 'open',
    duration REAL NOT NULL DEFAULT 0,
    training_resumed REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, round)
);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, round INTEGER NOT NULL, time REAL NOT NULL,
    node_rank INTEGER NOT NULL, rank INTEGER NOT NULL, fault_type TEXT NOT NULL,
    action TEXT NOT NULL, detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS strategies (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, round INTEGER NOT NULL, strategy TEXT NOT NULL,
    chosen_at REAL NOT NULL, ended_at REAL NOT NULL DEFAULT 0,
    outcome TEXT NOT NULL DEFAULT 'open', reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, round INTEGER NOT NULL, time REAL NOT NULL,
    kind TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS node_losses (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, round INTEGER NOT NULL, node_rank INTEGER NOT NULL,
    old_host TEXT NOT NULL DEFAULT '', old_pid INTEGER NOT NULL DEFAULT 0, lost_at REAL NOT NULL,
    new_host TEXT NOT NULL DEFAULT '', new_pid INTEGER NOT NULL DEFAULT 0, replaced_at REAL NOT NULL DEFAULT 0,
    standby INTEGER NOT NULL DEFAULT 0, seconds_to_round_end REAL NOT NULL DEFAULT 0,
    seconds_to_training_resumed REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, id);
CREATE INDEX IF NOT EXISTS node_losses_by_job ON node_losses (job_id, round);
CREATE INDEX IF NOT EXISTS faults_by_job ON faults (job_id, round);
CREATE INDEX IF NOT EXISTS strategies_by_job ON strategies (job_id, round);
"""

JOB_TABLES = ("jobs", "agents", "rounds", "faults", "strategies", "events", "node_losses")
"""Every table keyed by job id."""

ADDED_COLUMNS = (("rounds", "training_resumed"), ("node_losses", "seconds_to_training_resumed"))
"""Columns newer than the tables (REAL NOT NULL DEFAULT 0): added to a state file an older taskd wrote."""


STATE_VERSION = 2
"""The state file's schema version, kept as SQLite's `user_version` (0: written before taskd kept one). Raise it
whenever a taskd that reads only the versions up to the old one would misread or silently drop what this one
writes: that taskd then refuses the file instead (docs/controller.md, "Persistence"). 2: fault texts hold
ranges of ranks (`0-99999:1`), which version 1 cannot parse."""


def default_state_path() -> Path:
    """`$XDG_DATA_HOME/taskd/controller.sqlite3`, else `~/.local/share/taskd/controller.sqlite3`."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "taskd" / "controller.sqlite3"


def parse_fault_ranges(text: str) -> list[tuple[int, int, str]]:
    """(first, last, type) of each item of the state machine's "rank:type,first-last:type" form (model.fmt_faults)."""
    out = []
    for item in filter(None, text.split(",")):
        ranks, _, ftype = item.partition(":")
        first, _, last = ranks.partition("-")
        out.append((int(first), int(last or first), ftype))
    return out


def parse_fault_text(text: str) -> list[tuple[int, str]]:
    """Inverse of the state machine's "rank:type,first-last:type" form: one (rank, type) per rank."""
    return [(r, t) for a, b, t in parse_fault_ranges(text) for r in range(a, b + 1)]


def fault_rows(text: str) -> Iterator[tuple[int, str]]:
    """(rank, type) of each rank of `text`, lazily: the first rows of 100,000 ranks without listing them all."""
    for a, b, t in parse_fault_ranges(text):
        for r in range(a, b + 1):
            yield r, t




def _owner_only(path: str) -> None:
    """Create `path` 0600 if it does not exist (before SQLite does, at 0644), and tighten it and its
    companions if an older taskd left them readable by others."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, STATE_FILE_MODE)
    os.close(fd)
    for name in (path, path + "-wal", path + "-shm"):
        try:
            mode = stat.S_IMODE(os.stat(name).st_mode)
        except FileNotFoundError:
            continue
        if mode & ~STATE_FILE_MODE:
            os.chmod(name, mode & STATE_FILE_MODE)
            log.info("%s was mode %o; now %o (owner only)", name, mode, mode & STATE_FILE_MODE)


def _wall(to_wall: Callable[[float], float], t: float) -> float:
    return to_wall(t) if t else 0.0  # 0: never (an agent restored without a stamp)


class StoreError(Exception):
    """A change could not be written to the state file (rolled back there; the caller rolls back memory)."""

    def __init__(self, path: str, cause: BaseException) -> None:
        reason = str(cause) or type(cause).__name__
        super().__init__(f"cannot write the controller's state file {path}: {reason}")
        self.path = path
        self.cause = cause


class Store:
    """The controller's SQLite database; used from one thread (the server's event loop)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        target = str(default_state_path() if path is None else path)
        self.path = target
        self._events: list[tuple[Any, ...]] | None = None  # a transaction's history rows, inserted before COMMIT
        self.snapshot_bytes: dict[str, int] = {}  # job id -> its last snapshot's length (controller/storage/quota.py)
        conn: sqlite3.Connection | None = None
        try:
            if target != MEMORY:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                _owner_only(target)
                if why := wal_refusal(target):  # before SQLite opens it: it would drop those frames for good
                    raise OSError(why)
            conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > STATE_VERSION:  # before anything is written to it
                raise OSError(f"it was written by a newer taskd (state version {version}; this taskd reads versions "
                              f"up to {STATE_VERSION}, and would misread or drop what it does not know): run that "
                              "taskd or a newer one")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(SCHEMA)
            for table, column in ADDED_COLUMNS:
                if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} REAL NOT NULL DEFAULT 0")
            if version < STATE_VERSION:
                conn.execute(f"PRAGMA user_version = {STATE_VERSION}")
            self.conn = conn
        except (OSError, sqlite3.Error) as exc:
            if conn is not None:
                conn.close()  # no handle (nor lock) left on a file we could not use
            raise OSError(f"cannot use {target} as the controller's state: {exc}; pass --state PATH for another "
                          f"file, or --state :memory: to keep nothing") from exc
        log.info("controller state in %s", target)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ writes

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction; any failure inside it is rolled back and raised as `StoreError` naming the cause."""
        c = self.conn
        try:
            c.execute("BEGIN")
            self._events = []
            try:
                yield c
                if self._events:  # the history rows of the whole transaction in one call, in their order
                    c.executemany("INSERT INTO events (job_id, round, time, kind, detail) VALUES (?, ?, ?, ?, ?)",
                                  self._events)
                c.execute("COMMIT")
            except BaseException:
                # SQLite has already rolled back after some errors (a full disk, an I/O error): a second
                # ROLLBACK would raise "no transaction is active" and hide the cause
                if c.in_transaction:
                    try:
                        c.execute("ROLLBACK")
                    except sqlite3.Error as exc:
                        log.error("could not roll back the state file %s: %s", self.path, exc)
                raise
            finally:
                self._events = None
        except Exception as exc:  # sqlite3.Error, OSError, or a value SQLite or JSON cannot hold
            raise StoreError(self.path, exc) from exc

    def commit(self, job: Job, records: Iterable[Record], agents_changed: Iterable[int], now: float,
               earlier: Iterable[tuple[Record, float]] = (), to_wall: Callable[[float], float] = identity) -> None:
        """Persist the job's snapshot, its new history records and changed agents in one transaction
        (`earlier`: the job's batched soft records with their times, written first to keep the order).
        `now` and the records' times are wall times; `to_wall` turns the job's own (monotonic) times into
        wall times (taskd.controller.clock)."""
        with self._transaction():
            self._write_job(job, to_wall)
            self._write_history(job, itertools.chain(earlier, ((rec, now) for rec in records)), agents_changed,
                                to_wall)

    def commit_group(self, batch: Iterable[tuple[Job, Iterable[tuple[Record, float]], Iterable[int]]],
                     to_wall: Callable[[float], float] = identity) -> None:
        """Several handled events, of one job or many, in one transaction (the core's group commit): each
        event's history and changed agents in order, then each job's snapshot once, as the job is now (after
        all of its events in the batch)."""
        with self._transaction():
            jobs: dict[str, Job] = {}
            for job, records, agents_changed in batch:
                jobs[job.job_id] = job
                self._write_history(job, records, agents_changed, to_wall)
            self.conn.executemany(_UPSERT_JOB, [_job_row(job, to_wall, self.snapshot_bytes) for job in jobs.values()])

    def _write_job(self, job: Job, to_wall: Callable[[float], float]) -> None:
        self.conn.execute(_UPSERT_JOB, _job_row(job, to_wall, self.snapshot_bytes))

    def commit_soft(self, batch: Iterable[tuple[Job, Iterable[tuple[Record, float]], Iterable[int]]],
                    to_wall: Callable[[float], float] = identity) -> None:
        """Write batched soft records and agent rows of several jobs in one transaction (no snapshot:
        nothing in them changes what a restart restores)."""
        with self._transaction():
            for job, records, agents_changed in batch:
                self._write_history(job, records, agents_changed, to_wall)

    def _write_history(self, job: Job, records: Iterable[tuple[Record, float]],
                       agents_changed: Iterable[int], to_wall: Callable[[float], float]) -> None:
        for rec, t in records:
            self._write_record(job.job_id, rec, t)
        for node in agents_changed:
            self._write_agent(job.job_id, node, job.agents.get(node), to_wall)

    def _write_record(self, job_id: str, rec: Record, now: float) -> None:
        c, d = self.conn, rec.detail
        row = (job_id, rec.round, now, rec.kind, rec.detail_json)
        if self._events is not None:
            self._events.append(row)  # inserted with the transaction's others, before its COMMIT
        else:
            c.execute("INSERT INTO events (job_id, round, time, kind, detail) VALUES (?, ?, ?, ?, ?)", row)
        if rec.kind == "fault_reported":
            c.executemany(
                "INSERT INTO faults (job_id, round, time, node_rank, rank, fault_type, action, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(job_id, rec.round, now, d.get("node_rank", 0), r, t, d.get("action", ""), d.get("detail", ""))
                 for r, t in itertools.islice(fault_rows(d.get("faults", "")), FAULT_ROWS_PER_REPORT)],
            )
        elif rec.kind == "round_started":
            c.execute("INSERT OR REPLACE INTO rounds (job_id, round, started_at, faults) VALUES (?, ?, ?, ?)",
                      (job_id, rec.round, now, d.get("faults", "")))
        elif rec.kind in ("round_faults", "round_resumed"):
            c.execute("UPDATE rounds SET faults=? WHERE job_id=? AND round=?", (d.get("faults", ""), job_id, rec.round))
        elif rec.kind == "strategy_chosen":
            c.execute("INSERT INTO strategies (job_id, round, strategy, chosen_at) VALUES (?, ?, ?, ?)",
                      (job_id, rec.round, d["strategy"], now))
            c.execute("UPDATE rounds SET tried = json_insert(tried, '$[#]', ?) WHERE job_id=? AND round=?",
                      (d["strategy"], job_id, rec.round))
        elif rec.kind == "strategy_failed":
            self._end_strategy(job_id, rec.round, "failed", d.get("reason", ""), now)
        elif rec.kind == "round_ended":
            outcome = d.get("outcome", "")
            c.execute(
                "UPDATE rounds SET ended_at=?, outcome=?, strategy=?, duration=?, tried=? WHERE job_id=? AND round=?",
                (now, outcome, d.get("strategy", ""), d.get("duration", 0.0), json.dumps(d.get("tried", [])),
                 job_id, rec.round),
            )
            self._end_strategy(job_id, rec.round, "succeeded" if outcome in ("recovered", "dumped") else outcome, "",
                               now)
        elif rec.kind == "job_reset":
            c.execute("DELETE FROM agents WHERE job_id=?", (job_id,))
        elif rec.kind == "node_lost":
            c.execute("INSERT INTO node_losses (job_id, round, node_rank, old_host, old_pid, lost_at) "
                      "VALUES (?, ?, ?, ?, ?, ?)", (job_id, rec.round, d["node_rank"], d.get("host", ""),
                                                    d.get("pid", 0), now))
        elif rec.kind == "node_replaced":
            c.execute("UPDATE node_losses SET new_host=?, new_pid=?, replaced_at=?, standby=? WHERE id = "
                      "(SELECT max(id) FROM node_losses WHERE job_id=? AND node_rank=? AND replaced_at=0)",
                      (d.get("host", ""), d.get("pid", 0), now, int(bool(d.get("standby"))), job_id, d["node_rank"]))
        elif rec.kind == "round_training_resumed" and d.get("seconds") is not None:
            c.execute("UPDATE rounds SET training_resumed=? WHERE job_id=? AND round=?",
                      (d["seconds"], job_id, rec.round))
        if rec.kind in ("round_ended", "round_training_resumed") and d.get("since_loss"):
            column = "seconds_to_round_end" if rec.kind == "round_ended" else "seconds_to_training_resumed"
            c.executemany(f"UPDATE node_losses SET {column}=? WHERE job_id=? AND round=? AND node_rank=?",
                          [(s, job_id, rec.round, int(n)) for n, s in d["since_loss"].items()])

    def _end_strategy(self, job_id: str, rnd: int, outcome: str, reason: str, now: float) -> None:
        self.conn.execute(
            "UPDATE strategies SET outcome=?, reason=?, ended_at=? WHERE id = "
            "(SELECT max(id) FROM strategies WHERE job_id=? AND round=? AND outcome='open')",
            (outcome, reason, now, job_id, rnd),
        )

    def _write_agent(self, job_id: str, node: int, a: AgentInfo | None, to_wall: Callable[[float], float]) -> None:
        if a is None:
            self.conn.execute("DELETE FROM agents WHERE job_id=? AND node_rank=?", (job_id, node))
            return
        self.conn.execute(
            "INSERT OR REPLACE INTO agents (job_id, node_rank, role, host, pid, ranks_per_node, registered_at, "
            "last_seen, finished, exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, a.node_rank, a.role, a.host, a.pid, a.ranks_per_node, _wall(to_wall, a.registered_at),
             _wall(to_wall, a.last_seen), int(a.finished), a.exit_code),
        )

    def delete_jobs(self, job_ids: Iterable[str]) -> None:
        """Forget jobs and all their history in one transaction (evicted: a restart must not bring them back)."""
        rows = [(job_id,) for job_id in job_ids]
        with self._transaction() as c:
            for table in JOB_TABLES:
                c.executemany(f"DELETE FROM {table} WHERE job_id=?", rows)
        for (job_id,) in rows:
            self.snapshot_bytes.pop(job_id, None)

    def job_bytes(self) -> dict[str, int]:
        """Bytes each job's history holds (its events, fault rows and rounds' fault texts), counted as
        storage/quota.py's `record_bytes` counts what a change adds; with `snapshot_bytes`, its quota's use."""
        out: dict[str, int] = {}
        for query in (f"SELECT job_id, sum(length(CAST(detail AS BLOB))) + {EVENT_ROW} * count(*) FROM events "
                      "GROUP BY job_id",
                      "SELECT job_id, sum(length(CAST(detail AS BLOB)) + length(CAST(action AS BLOB))) + "
                      f"{FAULT_ROW} * count(*) FROM faults GROUP BY job_id",
                      "SELECT job_id, sum(length(CAST(faults AS BLOB))) FROM rounds GROUP BY job_id"):
            for job_id, n in self.conn.execute(query):
                out[job_id] = out.get(job_id, 0) + (n or 0)
        for job_id, n in self.conn.execute("SELECT job_id, length(CAST(snapshot AS BLOB)) FROM jobs"):
            self.snapshot_bytes[job_id] = n or 0  # counted apart: it is rewritten, not added to
        return out

    # ------------------------------------------------------------------ reads

    def load_jobs(self, job_id: str | None = None) -> list[tuple[dict[str, Any], list[AgentInfo]]]:
        """Every persisted job (or only `job_id`): its snapshot and its agents."""
        agents: dict[str, list[AgentInfo]] = {}
        where, args = ("WHERE job_id=? ", (job_id,)) if job_id is not None else ("", ())
        for row in self.conn.execute(
            "SELECT job_id, node_rank, role, host, pid, ranks_per_node, registered_at, last_seen, finished, exit_code "
            f"FROM agents {where}ORDER BY job_id, node_rank", args
        ):
            if why := agent_problem(row[1:]):  # the job loads without it: its agent registers again
                log.error("state file %s: job %r: an agents row not loaded (%s); its agent registers again",
                          self.path, row[0], why)
                continue
            agents.setdefault(row[0], []).append(AgentInfo(
                node_rank=row[1], role=row[2] or "", host=row[3] or "", pid=row[4] or 0, ranks_per_node=row[5] or 0,
                registered_at=row[6] or 0.0, last_seen=row[7] or 0.0, finished=bool(row[8]), exit_code=row[9],
            ))
        loaded = []
        for job, text in self.conn.execute(f"SELECT job_id, snapshot FROM jobs {where}ORDER BY created_at", args):
            try:
                snap = json.loads(text)
            except (TypeError, ValueError, RecursionError) as exc:
                snap, why = None, f"its snapshot is not JSON ({exc})"
            else:
                why = snapshot_problem(snap, job)
            if why:
                log.error("state file %s: job %r not loaded: %s; the other jobs load (its agents' next Init creates "
                          "it afresh)", self.path, job, why)
                continue
            loaded.append((snap, agents.get(job, [])))
        return loaded

    def rounds(self, job_id: str) -> list[dict[str, Any]]:
        cols = ("round", "started_at", "ended_at", "faults", "tried", "strategy", "outcome", "duration",
                "training_resumed")
        rows = self.conn.execute(f"SELECT {', '.join(cols)} FROM rounds WHERE job_id=? ORDER BY round", (job_id,))
        out = []
        for row in rows:
            d = dict(zip(cols, row, strict=True))
            d["faults"] = parse_fault_text(d["faults"])
            d["tried"] = json.loads(d["tried"] or "[]")
            out.append(d)
        return out

    def events(self, job_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The job's last `limit` events, oldest first."""
        rows = self.conn.execute(
            "SELECT time, kind, round, detail FROM events WHERE job_id=? ORDER BY id DESC LIMIT ?", (job_id, limit)
        ).fetchall()
        return [{"time": t, "kind": k, "round": r, "detail": d} for t, k, r, d in reversed(rows)]

    def node_losses(self, job_id: str) -> list[dict[str, Any]]:
        cols = ("round", "node_rank", "old_host", "old_pid", "lost_at", "new_host", "new_pid", "replaced_at",
                "standby", "seconds_to_round_end", "seconds_to_training_resumed")
        rows = self.conn.execute(f"SELECT {', '.join(cols)} FROM node_losses WHERE job_id=? ORDER BY id", (job_id,))
        return [dict(zip(cols, row, strict=True)) for row in rows]

    def faults(self, job_id: str) -> list[dict[str, Any]]:
        cols = ("round", "time", "node_rank", "rank", "fault_type", "action", "detail")
        rows = self.conn.execute(f"SELECT {', '.join(cols)} FROM faults WHERE job_id=? ORDER BY id", (job_id,))
        return [dict(zip(cols, row, strict=True)) for row in rows]

    def strategies(self, job_id: str) -> list[dict[str, Any]]:
        cols = ("round", "strategy", "chosen_at", "ended_at", "outcome", "reason")
        rows = self.conn.execute(f"SELECT {', '.join(cols)} FROM strategies WHERE job_id=? ORDER BY id", (job_id,))
        return [dict(zip(cols, row, strict=True)) for row in rows]
