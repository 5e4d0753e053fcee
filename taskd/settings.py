"""Every setting of the agent and of `taskd run`, once: name, type, default, flags, variable, bound, doc line.

`AgentConfig` (its field defaults, the TASKD_* variables `from_env` reads, its bounds), `RunConfig`
(its defaults, `taskd run`'s flag names, the bounds it checks), the `taskd server` fields holding the
same setting and docs/mindspore.md's table are derived from `SETTINGS` (`taskd server`'s own rows are
taskd/server_settings.py's); tests/unit/test_settings.py
checks the rest against it (the README's tables, argparse, no default written anywhere else).

Adding a setting is one `Setting(...)` line here plus its field in the config that uses it:
`AgentConfig` (``name: T = default("name")``) for `agent=True`, `RunConfig` for a `taskd run` flag
(with its `add_argument` in run_config/flags.py, whose names come from `flags`), then
`python -m taskd.settings --write docs/mindspore.md`. Validation stays where each config is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taskd.doc_block import DocBlock

WARM_SPARE_MODES = ("import", "script")
"""What a warm spare does before it is a rank (taskd.launcher.spares): import the framework, or also run the script."""


@dataclass(frozen=True)
class Bound:
    """The values a setting takes: `>= low` (or `> low` when the low end itself is not allowed), and at most
    `high` where a controller refuses more (it would answer 409 to the job's Init)."""

    low: int
    inclusive: bool = True
    high: int | None = None

    def allows(self, value: float) -> bool:
        if self.high is not None and value > self.high:
            return False
        return value > self.low or (self.inclusive and value == self.low)

    @property
    def rule(self) -> str:
        low = f">= {self.low}" if self.inclusive else f"> {self.low}"
        return low if self.high is None else f"{low} and <= {self.high}"


@dataclass(frozen=True)
class Setting:
    """One setting. `kind` is int, float, str, bool or tuple (a comma-separated list of names)."""

    name: str  # the AgentConfig field (for agent=False, the RunConfig field)
    kind: type
    default: Any
    doc: str
    bound: Bound | None = None
    optional: bool = False  # None is a value: off, or derived when the job starts
    flags: tuple[str, ...] = ()  # `taskd run`'s spellings, the dash form first (errors name it)
    env: str = ""  # the variable AgentConfig.from_env reads (msrun's way to set it)
    agent: bool = True  # an AgentConfig field
    run_field: str = ""  # the RunConfig field when it is not `name` ("" with no flags: not on `taskd run`)
    run_env: bool = False  # `taskd run` reads `env` itself, as the default of its flag
    label: str = ""  # how `taskd run` names it when it has no flag of its own
    derived: str = ""  # the agent's default is None: what it uses instead (msrun's table shows this)
    server_field: str = ""  # the ControllerConfig field holding the same setting for `taskd server`
    server_flag: str = ""
    shown: str = ""  # the default as the docs print it, when not the value itself

    @property
    def run(self) -> str:
        """The RunConfig field ("" when `taskd run` has no way to set it)."""
        return self.run_field or (self.name if self.flags or self.label else "")

    @property
    def flag(self) -> str:
        """How `taskd run`'s errors name it."""
        return self.label or (self.flags[0] if self.flags else "")

    @property
    def agent_default(self) -> Any:
        return None if self.derived else self.default


_POSITIVE, _NONNEGATIVE = Bound(0, inclusive=False), Bound(0)

SETTINGS: tuple[Setting, ...] = (
    Setting("job_id", str, None, "job id; every node of a job uses the same", optional=True,
            flags=("--job-id", "--job_id"), env="MINDX_TASK_ID", run_env=True, shown="generated"),
    Setting("server", str, None, "controller `host[:port]`", optional=True, flags=("--server",),
            env="MINDX_SERVER_IP", run_env=True, shown="unset: embedded controller"),
    Setting("node_rank", int, 0, "this node's rank, 0..nnodes-1", Bound(0), True, ("--node-rank", "--node_rank"),
            "TASKD_NODE_RANK", derived="msrun's node id (MONITOR), else 0"),
    Setting("node_count", int, 1, "nodes in the job", Bound(1), True, ("--nnodes",), "TASKD_NNODES",
            run_field="nnodes", derived="MS_WORKER_NUM / ranks per node, else 1"),
    Setting("min_nodes", int, 0, "the fewest nodes the job goes on with when a lost node is not replaced in time "
            "(scale-in; opt-in, with `LiveGroup(on_resize=...)`); 0 or nnodes = a fixed-size job", Bound(0),
            env="TASKD_MIN_NODES", run_field="min_nnodes", label="--nnodes MIN:MAX"),
    Setting("ranks_per_node", int, 1, "ranks on this node", Bound(1), True, ("--nproc-per-node", "--nproc_per_node"),
            "TASKD_NPROC_PER_NODE", run_field="nproc_per_node", derived="the ranks msrun's MONITOR lists"),
    Setting("strategies", tuple, (), "strategies this agent offers, in order, e.g. `job-rescheduling,exit`",
            flags=("--strategies",), env="TASKD_STRATEGIES", shown="`job-rescheduling,exit` under msrun"),
    # at most 10,000: the controller refuses a larger budget (controller/validation.py, MAX_RESTART_BUDGET)
    Setting("max_restarts", int, 3, "restart budget of the job", Bound(0, high=10_000),
            flags=("--max-restarts", "--max_restarts"), env="TASKD_MAX_RESTARTS",
            server_field="default_max_restarts", server_flag="--max-restarts"),
    Setting("monitor_interval", float, 1.0, "seconds between the agent's sweeps (hang checks run on them)", _POSITIVE,
            flags=("--monitor-interval", "--monitor_interval"), env="TASKD_MONITOR_INTERVAL"),
    Setting("stop_grace", float, 5.0, "seconds from SIGTERM to SIGKILL when the agent stops ranks", _NONNEGATIVE,
            flags=("--stop-grace", "--stop_grace"), env="TASKD_STOP_GRACE"),
    Setting("controller_timeout", float, 30.0, "seconds an unreachable controller is retried before the agent "
            "degrades (a single-node job restarts its ranks itself)", _NONNEGATIVE, env="TASKD_CONTROLLER_TIMEOUT"),
    Setting("heartbeat_timeout", float, None, "seconds without `taskd.worker.heartbeat()` after which a rank counts "
            "as hung; under msrun keep it below the collective timeout (MS_CPU_COMM_OP_TIMEOUT, HCCL_EXEC_TIMEOUT)",
            _POSITIVE, True, ("--heartbeat-timeout", "--heartbeat_timeout"), "TASKD_HEARTBEAT_TIMEOUT",
            shown="unset: under msrun derived from the step times; under `taskd run` no hang detection"),
    Setting("log_dir", str, None, "where taskd writes its own log file",
            optional=True, flags=("--log-dir", "--log_dir"), env="TASKD_LOG_DIR", shown="msrun's `--log_dir`"),
    Setting("dump_timeout", float, 30.0, "seconds the `dump` strategy waits for ranks to save", _POSITIVE,
            flags=("--dump-timeout", "--dump_timeout"), env="TASKD_DUMP_TIMEOUT"),
    Setting("scheduler_grace", float, 60.0, "seconds an agent whose ranks all finished waits for the whole job to end "
            "(see \"How a multi-node job ends\")", _NONNEGATIVE, env="TASKD_SCHEDULER_GRACE"),
    Setting("join_timeout", float, 600.0, "seconds a node of a multi-node job waits, before starting any rank, for "
            "every node to join (torchrun's rendezvous join_timeout)", _POSITIVE, env="TASKD_JOIN_TIMEOUT",
            label="--rdzv-conf join_timeout", server_field="join_timeout", server_flag="--join-timeout"),
    Setting("node_rejoin_timeout", float, 300.0, "seconds a replacement node waits for its node-loss round's "
            "strategy before it gives up, no rank started (the controller's --node-rejoin-timeout bounds the round)",
            _POSITIVE, env="TASKD_NODE_REJOIN_TIMEOUT", server_field="node_rejoin_timeout",
            server_flag="--node-rejoin-timeout"),
    Setting("standby", bool, False, "join as a spare node: no rank until the controller assigns a lost node's rank; "
            "exit 0 if none is", flags=("--standby",)),
    Setting("metrics_listen", str, None, "serve this node's Prometheus metrics at `HOST[:PORT]` (port 9465 if none; "
            "the `[metrics]` extra; docs/operations.md)", optional=True, flags=("--metrics-listen",),
            env="TASKD_METRICS_LISTEN", shown="unset: off"),
    Setting("straggler_factor", float, None, "report a rank whose compute time per step (outside collectives) is "
            "this many times the median of the job's other ranks (docs/operations.md, \"Stragglers\")",
            Bound(1, inclusive=False), True, ("--straggler-factor", "--straggler_factor"), "TASKD_STRAGGLER_FACTOR",
            shown="unset: off"),
    Setting("straggler_interval", float, 5.0, "seconds between an agent's pace reports to the controller (with "
            "`--straggler-factor`)", _POSITIVE, flags=("--straggler-interval", "--straggler_interval"),
            env="TASKD_STRAGGLER_INTERVAL"),
    # `taskd run` only (the launcher's)
    Setting("warm_spares", int, 0, "Python interpreters kept ready to become a restarted rank", _NONNEGATIVE,
            flags=("--warm-spares", "--warm_spares"), agent=False),
    Setting("warm_spare_mode", str, "import", "what a warm spare does before it is a rank: `import` the framework, or "
            "also run the `script` up to `LiveGroup()` / `taskd.worker.become_rank()` (its model built before the "
            "fault; docs/worker.md)", flags=("--warm-spare-mode", "--warm_spare_mode"), agent=False),
    Setting("snapshot_memory", str, None, "memory for the ranks' in-memory snapshots on this node, per job: bytes "
            "or `512M`/`2G`, `0` off (docs/worker.md)", optional=True,
            flags=("--snapshot-memory", "--snapshot_memory"), env="TASKD_SNAPSHOT_MEMORY", agent=False, run_env=True,
            shown="half of /dev/shm"),
    Setting("snapshot_persist_dir", str, None, "the agent copies the ranks' snapshots to this directory in the "
            "background (the durable copies a job keeps after it ends; a restore falls back to them; docs/worker.md)",
            optional=True, flags=("--snapshot-persist-dir", "--snapshot_persist_dir"), env="TASKD_SNAPSHOT_PERSIST_DIR",
            agent=False, run_env=True, shown="unset: off"),
    Setting("snapshot_persist_every", int, 100, "with `--snapshot-persist-dir`: persist the snapshot of every Nth "
            "step (and the newest when the job ends)", Bound(1),
            flags=("--snapshot-persist-every", "--snapshot_persist_every"), env="TASKD_SNAPSHOT_PERSIST_EVERY",
            agent=False, run_env=True),
    Setting("snapshot_persist_keep", int, 3, "with `--snapshot-persist-dir`: persisted steps kept per rank", Bound(1),
            flags=("--snapshot-persist-keep", "--snapshot_persist_keep"), env="TASKD_SNAPSHOT_PERSIST_KEEP",
            agent=False, run_env=True),
    Setting("role", str, "default", "the ranks' `ROLE_NAME`", flags=("--role",), agent=False),
    Setting("master_addr", str, "127.0.0.1", "`MASTER_ADDR` for the ranks", flags=("--master-addr", "--master_addr"),
            agent=False),
    Setting("quiet", bool, False, "do not echo rank output on the console", flags=("--quiet",), agent=False),
    # a variable alone (no flag, no AgentConfig field): read with `env_text` where it is used
    Setting("rdzv_store", str, "auto", "where a live-recovery job's rendezvous store runs: `auto` (node 0's agent "
            "hosts it, as torchrun's does), `agent` (always), `rank` (rank 0's `init_process_group`)",
            env="TASKD_RDZV_STORE", agent=False),
    Setting("preimport", str, "", "modules a warm spare imports before it becomes a rank (comma-separated; a live "
            "job's default: torch and taskd.worker.torch)", env="TASKD_PREIMPORT", agent=False),
    Setting("pyspy", str, "1", "`0`: a hung rank's stacks are never taken with py-spy, even when it is installed "
            "(faulthandler's are)", env="TASKD_PYSPY", agent=False),
)

BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}
AGENT_SETTINGS = tuple(s for s in SETTINGS if s.agent)
RUN_SETTINGS = tuple(s for s in SETTINGS if s.run)

# Variables of msrun's table that no taskd config holds: msrun reads the first, each rank (taskd.worker,
# which imports nothing of taskd) the second.
OTHER_VARIABLES = (
    ("MS_ENABLE_TFT", "must contain `RSC:1` (or another of `TTP:1 UCE:1 ARF:1 TSP:1 HCCE:1`)",
     "unset: msrun supervises alone"),
    ("TASKD_STACK_SIGNAL", "signal a rank dumps its Python stacks on (name or number)", "`SIGUSR2`"),
)


def setting(name: str) -> Setting:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no setting {name!r} in taskd/settings.py; known: {', '.join(BY_NAME)}") from None


def default(name: str) -> Any:
    """A setting's default, for a config's field (`max_restarts: int = default("max_restarts")`)."""
    return setting(name).default


def env_text(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The text of a setting's variable, stripped ("" when unset): the table's reader for a TASKD_*/MINDX_* variable
    read outside a config's `from_env` (each caller parses it as it documents)."""
    var = setting(name).env
    if not var:
        raise KeyError(f"setting {name!r} has no variable in taskd/settings.py")
    return (os.environ if environ is None else environ).get(var, "").strip()


def _check(settings: tuple[Setting, ...]) -> None:
    """At import: a table that contradicts itself fails every command, not one user's run."""
    seen: set[str] = set()
    for s in settings:
        names = [s.name, *s.flags, *([s.env] if s.env else [])]
        clash = seen.intersection(names)
        assert not clash, f"{s.name}: {clash} named twice in SETTINGS"
        seen.update(names)
        assert s.kind in (int, float, str, bool, tuple), f"{s.name}: kind {s.kind!r}"
        assert s.default is not None or s.optional, f"{s.name}: default None needs optional=True"
        assert s.default is None or isinstance(s.default, s.kind), f"{s.name}: default {s.default!r} is not {s.kind}"
        assert s.bound is None or s.default is None or s.bound.allows(s.default), f"{s.name}: default out of bounds"
        assert not s.derived or s.optional, f"{s.name}: a derived default needs optional=True"
        assert not s.run_env or s.env, f"{s.name}: run_env without env"
        assert bool(s.server_field) == bool(s.server_flag), f"{s.name}: server_field and server_flag go together"
        assert all(f.startswith("--") for f in s.flags), f"{s.name}: flags are --long options"


_check(SETTINGS)

# ---------------------------------------------------------------------------- the docs' table


def doc_default(s: Setting) -> str:
    """The default as msrun's table prints it."""
    if s.shown or s.derived:
        return s.shown or s.derived
    if s.default is None:
        return "unset"
    return f"{s.default:g}" if isinstance(s.default, float) else str(s.default)


def describe_settings() -> str:
    """docs/mindspore.md's table: every variable the agent reads under msrun."""
    rows = ["| variable | meaning | default |", "| --- | --- | --- |"]
    first, last = OTHER_VARIABLES[0], OTHER_VARIABLES[1:]
    rows.append(f"| `{first[0]}` | {first[1]} | {first[2]} |")
    rows += [f"| `{s.env}` | {s.doc} | {doc_default(s)} |" for s in AGENT_SETTINGS if s.env]
    rows += [f"| `{var}` | {doc} | {value} |" for var, doc, value in last]
    return "\n".join(rows)


DOC = DocBlock("settings", "taskd.settings", "docs/mindspore.md", "the settings table", describe_settings,
               description=__doc__.splitlines()[0])
BEGIN, END, update_doc, main = DOC.begin, DOC.end, DOC.update, DOC.main

if __name__ == "__main__":
    raise SystemExit(main())
