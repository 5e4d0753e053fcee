"""Every setting of `taskd run`, the agent and the client, once: name, scope, type, default, flags, variable, help.

From `SETTINGS`: `AgentConfig` (its field defaults, the TASKD_* variables `from_env` reads, its bounds), `RunConfig`
(its defaults and bounds), `taskd run`'s argparse (run_config/flags.py lays the rows out: spellings, metavars,
--help lines, torchrun's notices), `ClientOptions`' defaults, the `taskd server` fields holding the same setting,
and three docs' tables (docs/mindspore.md's variables here; README's flags, run_config/flag_table.py;
docs/client.md's options, client/option_table.py). `taskd server`'s own rows, and `taskd status`/`token`/
`migrate`'s flags, are taskd/server_settings.py's.
tests/unit/test_settings.py checks the rest against it (no default written anywhere else, no config dataclass
with a literal default), tests/unit/test_settings_readers.py that no TASKD_*/MINDX_* variable is read elsewhere.

Adding a setting is one `Setting(...)` line here plus its field in its scope's config (``name: T =
default("name")``), a `taskd run` flag's row in one of run_config/flags.py's `GROUPS`, then the docs' `--write`.
Validation stays where each config is built.
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

    name: str  # the field of its scope's config (AgentConfig, RunConfig, ClientOptions), or its flag's dest
    kind: type
    default: Any
    doc: str
    bound: Bound | None = None
    optional: bool = False  # None is a value: off, or derived when the job starts
    flags: tuple[str, ...] = ()  # `taskd run`'s spellings, the dash form first (errors name it)
    env: str = ""  # the variable AgentConfig.from_env reads (msrun's way to set it)
    scope: str = "agent"  # which config holds it: one of SCOPES
    env_aliases: tuple[str, ...] = ()  # older names of `env`, which `env_text` still reads when it is unset
    run_field: str = ""  # the RunConfig field when it is not `name` ("" with no flags: not on `taskd run`)
    run_env: bool = False  # `taskd run` reads `env` itself, as the default of its flag
    label: str = ""  # how `taskd run` names it when it has no flag of its own
    derived: str = ""  # the agent's default is None: what it uses instead (msrun's table shows this)
    server_field: str = ""  # the ControllerConfig field holding the same setting for `taskd server`
    server_flag: str = ""
    shown: str = ""  # the default as the docs print it, when not the value itself
    # `taskd run --help`'s line, for an agent setting whose `doc` says what its variable means under msrun (rows
    # without one print `doc`); either may name {default}, {env}, {s[other].env}
    help: str = ""
    metavar: str = ""  # `taskd run --help`'s name of the value
    notice: str = ""  # a torchrun flag that means less under taskd: the line printed when it is given

    @property
    def agent(self) -> bool:
        """An AgentConfig field."""
        return self.scope == "agent"

    @property
    def run(self) -> str:
        """The RunConfig field ("" when `taskd run` has no way to set it, or has no field of its own for it)."""
        if self.scope not in ("agent", "run"):
            return ""
        return self.run_field or (self.name if self.flags or self.label else "")

    @property
    def dest(self) -> str:
        """The argparse name of its `taskd run` flag ("" without one)."""
        return (self.run or self.name) if self.flags else ""

    @property
    def value_text(self) -> str:
        """The default as --help prints it (`5`, not `5.0`)."""
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def help_text(self) -> str | None:
        """`taskd run --help`'s line: `help`, else `doc`, its {default}/{env}/{s[name].x} filled from the table."""
        text = self.help or self.doc
        return text.format(default=self.value_text, env=self.env, s=BY_NAME) if text else None

    @property
    def flag(self) -> str:
        """How `taskd run`'s errors name it."""
        return self.label or (self.flags[0] if self.flags else "")

    @property
    def agent_default(self) -> Any:
        return None if self.derived else self.default


_POSITIVE, _NONNEGATIVE = Bound(0, inclusive=False), Bound(0)
LAUNCHERS = ("msrun", "taskd")
"""Who runs an agent: msrun (which loads it as a plugin, configured by the TASKD_* variables) or `taskd run`."""
# agent: an AgentConfig field (and, with flags, a RunConfig one); run: a RunConfig field alone; flag: a `taskd run`
# flag with no field of its own (torchrun's, read by run_config/build.py); client: a ClientOptions field (taskd.client);
# variable: a variable alone, read with `env_text` where it is used
SCOPES = ("agent", "run", "flag", "client", "variable")

SETTINGS: tuple[Setting, ...] = (
    Setting("launcher", str, LAUNCHERS[0], "who runs this agent: `msrun` (its plugin) or `taskd` (`taskd run`); it "
            "decides the default strategies"),
    Setting("job_id", str, None, "job id; every node of a job uses the same", optional=True,
            flags=("--job-id", "--job_id"), env="MINDX_TASK_ID", run_env=True, shown="generated", metavar="ID",
            help="taskd: job id shared by every node (default: ${env}, $SLURM_JOB_ID or a generated one)"),
    Setting("server", str, None, "controller `host[:port]`", optional=True, flags=("--server",),
            env="MINDX_SERVER_IP", run_env=True, shown="unset: embedded controller", metavar="HOST:PORT",
            help="taskd: the controller (a `taskd server`) shared by the job's nodes (default ${env}, else an "
                 "embedded controller, which only a one-node job can use)"),
    Setting("node_rank", int, 0, "this node's rank, 0..nnodes-1", Bound(0), True, ("--node-rank", "--node_rank"),
            "TASKD_NODE_RANK", derived="msrun's node id (MONITOR), else 0", metavar="R",
            help="this node's rank, 0..nnodes-1 (default {default})"),
    Setting("node_count", int, 1, "nodes in the job", Bound(1), True, ("--nnodes",), "TASKD_NNODES",
            env_aliases=("TASKD_NODE_COUNT",), run_field="nnodes", derived="MS_WORKER_NUM / ranks per node, else 1",
            metavar="N|MIN:MAX",
            help="nodes in the job (default {default}). With MIN < MAX, once nodes 0..MIN-1 joined the job starts "
                 "after a last call (--rdzv-conf last_call_timeout) with the nodes present, and each node that joins "
                 "later restarts every rank at the new size; a lost node not replaced within the controller's "
                 "--node-rejoin-timeout lets it go on with the rest (at least MIN; scale-in, if every rank passes "
                 "LiveGroup(on_resize=...)), and it grows back when a node joins again (docs/pytorch.md)"),
    Setting("min_nodes", int, 0, "the fewest nodes the job goes on with when a lost node is not replaced in time "
            "(scale-in; opt-in, with `LiveGroup(on_resize=...)`); 0 or nnodes = a fixed-size job", Bound(0),
            env="TASKD_MIN_NODES", run_field="min_nnodes", label="--nnodes MIN:MAX"),
    Setting("ranks_per_node", int, 1, "ranks on this node", Bound(1), True, ("--nproc-per-node", "--nproc_per_node"),
            "TASKD_NPROC_PER_NODE", env_aliases=("TASKD_RANKS_PER_NODE",), run_field="nproc_per_node",
            derived="the ranks msrun's MONITOR lists",
            metavar="N|auto|cpu|gpu", help="ranks on this node (default {default}): a number; cpu = the CPUs this "
            "process may use; gpu = the GPUs (CUDA_VISIBLE_DEVICES, else /dev/nvidiaN); auto = gpu if there are any, "
            "else cpu"),
    Setting("strategies", tuple, (), "strategies this agent offers, in order, e.g. `job-rescheduling,exit`",
            flags=("--strategies",), env="TASKD_STRATEGIES", shown="`job-rescheduling,exit` under msrun",
            metavar="LIST",
            help="taskd: recovery strategies offered, in order (default recover,job-rescheduling,exit)"),
    # at most 10,000: the controller refuses a larger budget (controller/service/validation.py, MAX_RESTART_BUDGET)
    Setting("max_restarts", int, 3, "restart budget of the job", Bound(0, high=10_000),
            flags=("--max-restarts", "--max_restarts"), env="TASKD_MAX_RESTARTS",
            server_field="default_max_restarts", server_flag="--max-restarts", metavar="K",
            help="restarts the job may use before it fails (default {default}; torchrun's default is 0)"),
    Setting("monitor_interval", float, 1.0, "seconds between the agent's sweeps (hang checks run on them)", _POSITIVE,
            flags=("--monitor-interval", "--monitor_interval"), env="TASKD_MONITOR_INTERVAL", metavar="S",
            help="slow sweep for what pidfds cannot tell, e.g. hangs (default {default}); a rank's exit is seen at "
                 "once"),
    Setting("stop_grace", float, 5.0, "seconds from SIGTERM to SIGKILL when the agent stops ranks", _NONNEGATIVE,
            flags=("--stop-grace", "--stop_grace"), env="TASKD_STOP_GRACE", metavar="S",
            help="taskd: SIGTERM to SIGKILL when stopping ranks (default {default})"),
    Setting("controller_timeout", float, 30.0, "seconds an unreachable controller is retried before the agent "
            "degrades (a single-node job restarts its ranks itself)", _NONNEGATIVE, env="TASKD_CONTROLLER_TIMEOUT"),
    Setting("heartbeat_timeout", float, None, "seconds without `taskd.worker.heartbeat()` after which a rank counts "
            "as hung; under msrun keep it below the collective timeout (MS_CPU_COMM_OP_TIMEOUT, HCCL_EXEC_TIMEOUT)",
            _POSITIVE, True, ("--heartbeat-timeout", "--heartbeat_timeout"), "TASKD_HEARTBEAT_TIMEOUT",
            shown="unset: under msrun derived from the step times; under `taskd run` no hang detection", metavar="S",
            help="taskd: a rank whose last taskd.worker.heartbeat() is older is hung (default: off)"),
    Setting("log_dir", str, None, "where taskd writes its own log file",
            optional=True, flags=("--log-dir", "--log_dir"), env="TASKD_LOG_DIR", shown="msrun's `--log_dir`",
            metavar="DIR", help="per-rank logs <DIR>/rank_<N>.log, appended across restarts"),
    Setting("dump_timeout", float, 30.0, "seconds the `dump` strategy waits for ranks to save", _POSITIVE,
            flags=("--dump-timeout", "--dump_timeout"), env="TASKD_DUMP_TIMEOUT", metavar="S",
            help="taskd: how long the dump strategy waits for ranks to save (default {default})"),
    Setting("scheduler_grace", float, 60.0, "seconds an agent whose ranks all finished waits for the whole job to end "
            "(see \"How a multi-node job ends\")", _NONNEGATIVE, env="TASKD_SCHEDULER_GRACE"),
    Setting("join_timeout", float, 600.0, "seconds a node of a multi-node job waits, before starting any rank, for "
            "every node to join (torchrun's rendezvous join_timeout)", _POSITIVE, env="TASKD_JOIN_TIMEOUT",
            label="--rdzv-conf join_timeout", server_field="join_timeout", server_flag="--join-timeout"),
    Setting("last_call_timeout", float, 30.0, "seconds a `--nnodes MIN:MAX` job waits for more nodes once MIN have "
            "joined, before it starts with the nodes present (torchrun's rendezvous last_call_timeout); the job's "
            "controller applies it: node 0's under the torchrun line, else `taskd server --last-call-timeout`",
            _NONNEGATIVE, env="TASKD_LAST_CALL_TIMEOUT", label="--rdzv-conf last_call_timeout",
            server_field="last_call_timeout", server_flag="--last-call-timeout"),
    Setting("node_rejoin_timeout", float, 300.0, "seconds a replacement node waits for its node-loss round's "
            "strategy before it gives up, no rank started (the controller's --node-rejoin-timeout bounds the round)",
            _POSITIVE, env="TASKD_NODE_REJOIN_TIMEOUT", server_field="node_rejoin_timeout",
            server_flag="--node-rejoin-timeout"),
    Setting("standby", bool, False, "taskd: join the job as a spare node (needs --server): start no rank, take over "
            "the node rank of the first node the controller declares lost, and exit 0 if none is (docs/node-loss.md)",
            flags=("--standby",)),
    Setting("metrics_listen", str, None, "serve this node's Prometheus metrics at `HOST[:PORT]` (port 9465 if none; "
            "the `[metrics]` extra; docs/operations.md)", optional=True, flags=("--metrics-listen",),
            env="TASKD_METRICS_LISTEN", shown="unset: off", metavar="HOST[:PORT]",
            help="taskd: serve this node's Prometheus metrics at http://HOST:PORT/metrics (port 9465 if none; "
                 "pip install 'taskd[metrics]'; docs/operations.md)"),
    Setting("straggler_factor", float, None, "report a rank whose compute time per step (outside collectives) is "
            "this many times the median of the job's other ranks (docs/operations.md, \"Stragglers\")",
            Bound(1, inclusive=False), True, ("--straggler-factor", "--straggler_factor"), "TASKD_STRAGGLER_FACTOR",
            shown="unset: off", metavar="F",
            help="taskd: report a rank whose compute time per step (outside collectives) is F times the median of "
                 "the other ranks' (default: off; docs/operations.md)"),
    Setting("straggler_interval", float, 5.0, "seconds between an agent's pace reports to the controller (with "
            "`--straggler-factor`)", _POSITIVE, flags=("--straggler-interval", "--straggler_interval"),
            env="TASKD_STRAGGLER_INTERVAL", metavar="S",
            help="taskd: seconds between pace reports with --straggler-factor (default {default})"),
    Setting("migrate_stragglers", bool, False, "taskd: with --straggler-factor, move a rank that stays a straggler "
            "for a window (two pace reports) to a warm spare (--warm-spares) at a step boundary, at most one a "
            "window, never without a spare ready; one-node LiveGroup jobs (docs/pytorch.md, \"Stragglers moved\")",
            flags=("--migrate-stragglers", "--migrate_stragglers")),
    Setting("drain_file", str, None, "taskd: the drain hook as a file: when it appears, this node's agent asks the "
            "controller to move its ranks to a standby agent, as SIGUSR1 does, and removes it (a Kubernetes preStop "
            "hook or a health check `touch`es it; docs/operations.md, \"Draining a node\")", optional=True,
            flags=("--drain-file", "--drain_file"), env="TASKD_DRAIN_FILE", shown="unset: off", metavar="PATH",
            help="taskd: when PATH appears, move this node's ranks to a standby agent (`taskd migrate --node`, as "
                 "SIGUSR1 does) and remove PATH; its directory must exist (default ${env}, else off; "
                 "docs/operations.md)"),
    # `taskd run` only (the launcher's)
    Setting("warm_spares", int, 0, "taskd: Python interpreters kept ready to become a restarted rank (.py scripts; "
            "default {default})", _NONNEGATIVE, flags=("--warm-spares", "--warm_spares"), scope="run", metavar="N"),
    Setting("warm_spare_mode", str, "import", "taskd: import: a spare has imported the framework; script: it has also "
            "run the script up to LiveGroup() / taskd.worker.become_rank(), so a replacement's model is built before "
            "the fault (default {default}; docs/worker.md)", flags=("--warm-spare-mode", "--warm_spare_mode"),
            scope="run", metavar="import|script"),
    Setting("snapshot_memory", str, None, "taskd: memory for the ranks' in-memory snapshots on this node (512M, 2G; "
            "0: off; default: half of /dev/shm; docs/worker.md)", optional=True,
            flags=("--snapshot-memory", "--snapshot_memory"), env="TASKD_SNAPSHOT_MEMORY", scope="run", run_env=True,
            shown="half of /dev/shm", metavar="BYTES"),
    Setting("snapshot_persist_dir", str, None, "taskd: the agent copies the snapshots here in the background, every "
            "--snapshot-persist-every steps and at the job's end; a restore falls back to them (default: off)",
            optional=True, flags=("--snapshot-persist-dir", "--snapshot_persist_dir"), env="TASKD_SNAPSHOT_PERSIST_DIR",
            scope="run", run_env=True, shown="unset: off", metavar="DIR"),
    Setting("snapshot_persist_every", int, 100, "taskd: persist every Nth step's snapshot (default {default})",
            Bound(1), flags=("--snapshot-persist-every", "--snapshot_persist_every"),
            env="TASKD_SNAPSHOT_PERSIST_EVERY", scope="run", run_env=True, metavar="N"),
    Setting("snapshot_persist_keep", int, 3, "taskd: persisted steps kept per rank (default {default})", Bound(1),
            flags=("--snapshot-persist-keep", "--snapshot_persist_keep"), env="TASKD_SNAPSHOT_PERSIST_KEEP",
            scope="run", run_env=True, metavar="K"),
    Setting("role", str, "default", "the ranks' role, ROLE_NAME (default '{default}')", flags=("--role",), scope="run",
            metavar="NAME"),
    Setting("master_addr", str, "127.0.0.1", "MASTER_ADDR for the ranks (default {default}, or node 0's host under "
            "Slurm/Kubernetes)", flags=("--master-addr", "--master_addr"), scope="run", metavar="HOST"),
    Setting("master_port", int, 0, "MASTER_PORT for the ranks (default: a free port on a one-node job, 29500 "
            "otherwise)", flags=("--master-port", "--master_port"), scope="run", metavar="PORT",
            shown="a free port (29500 with several nodes)"),
    Setting("quiet", bool, False, "taskd: do not echo rank output on the console", flags=("--quiet",), scope="run"),
    # how this node proves itself to --server: paths, read by run.py and taskd.client (client/credentials.py)
    Setting("token_file", str, None, "taskd: the controller's token, sent with every call (default ${env}; see "
            "RELIABILITY.md)", optional=True, flags=("--token-file", "--token_file"), env="TASKD_TOKEN_FILE",
            scope="run", metavar="PATH"),
    Setting("tls_ca", str, None, "taskd: trust this CA for a TLS controller (default ${env})", optional=True,
            flags=("--tls-ca", "--tls_ca"), env="TASKD_TLS_CA", scope="run", metavar="PEM"),
    Setting("tls_cert", str, None, "taskd: client certificate for a controller that requires one (default ${env})",
            optional=True, flags=("--tls-cert", "--tls_cert"), env="TASKD_TLS_CERT", scope="run", metavar="PEM"),
    Setting("tls_key", str, None, "taskd: its key (default ${env})", optional=True, flags=("--tls-key", "--tls_key"),
            env="TASKD_TLS_KEY", scope="run", metavar="PEM"),
    # `taskd run`'s flags with no field of their own: torchrun's, read by run_config/build.py (a notice where one
    # means less under taskd; the notices are printed in this order)
    Setting("rdzv_backend", str, None, "accepted; taskd has no rendezvous (nodes join through the controller)",
            optional=True, flags=("--rdzv-backend", "--rdzv_backend"), scope="flag", metavar="NAME",
            notice="taskd has no rendezvous backend: nodes join through the job's controller (node 0's, on the port "
                   "after --rdzv-endpoint's, or --server), so the backend is not used"),
    Setting("rdzv_conf", str, None, "join_timeout=SECONDS: how long a node of a multi-node job waits for the others "
            "to join before it gives up, starting no rank (default ${s[join_timeout].env}, else "
            "{s[join_timeout].value_text}, as torchrun); last_call_timeout=SECONDS: how long a --nnodes MIN:MAX job "
            "waits for more nodes once MIN joined (default ${s[last_call_timeout].env}, else "
            "{s[last_call_timeout].value_text}, as torchrun); other keys are accepted and not used", optional=True,
            flags=("--rdzv-conf", "--rdzv_conf"), scope="flag", metavar="K=V,...",
            notice="taskd has no rendezvous: of its settings only join_timeout (how long a node waits for the job's "
                   "other nodes) and last_call_timeout (a MIN:MAX job's wait for more once MIN joined) are used; the "
                   "others are not (timeouts: --heartbeat-timeout, --stop-grace)"),
    Setting("start_method", str, None, "", optional=True, flags=("--start-method", "--start_method"), scope="flag",
            metavar="spawn|fork|forkserver",
            notice="taskd always starts each rank as a new process (as torchrun's spawn)"),
    Setting("event_log_handler", str, None, "", optional=True, flags=("--event-log-handler", "--event_log_handler"),
            scope="flag", metavar="NAME", notice="taskd prints one line per event on stderr and keeps the history in "
            "its controller (taskd status); torch's event handlers are not called"),
    Setting("logs_specs", str, None, "", optional=True, flags=("--logs-specs", "--logs_specs"), scope="flag",
            metavar="NAME", notice="taskd writes <log-dir>/rank_<N>.log itself; a LogsSpecs class is not loaded"),
    Setting("numa_binding", str, None, "", optional=True, flags=("--numa-binding", "--numa_binding"), scope="flag",
            metavar="MODE", notice="taskd does not bind ranks to NUMA nodes; use numactl in the command, or "
            "--no-python"),
    Setting("signals_to_handle", str, None, "", optional=True, flags=("--signals-to-handle", "--signals_to_handle"),
            scope="flag", metavar="SIGS", notice="taskd stops the ranks on SIGTERM, SIGINT and SIGHUP (SIGTERM, then "
            "SIGKILL after --stop-grace); other signals are not forwarded"),
    Setting("duplicate_stdout_filters", str, None, "", optional=True, scope="flag", metavar="F,...",
            flags=("--duplicate-stdout-filters", "--duplicate_stdout_filters"),
            notice="not supported: filter the rank logs (--log-dir) instead"),
    Setting("duplicate_stderr_filters", str, None, "", optional=True, scope="flag", metavar="F,...",
            flags=("--duplicate-stderr-filters", "--duplicate_stderr_filters"),
            notice="not supported: filter the rank logs (--log-dir) instead"),
    Setting("virtual_local_rank", bool, False, "", flags=("--virtual-local-rank", "--virtual_local_rank"),
            scope="flag", notice="not supported: LOCAL_RANK stays the rank's index on its node and "
            "CUDA_VISIBLE_DEVICES is left as it is"),
    Setting("local_addr", str, None, "accepted; not used", optional=True, flags=("--local-addr", "--local_addr"),
            scope="flag", metavar="HOST",
            notice="not used: an agent reaches the controller and reports this host's name"),
    Setting("run_path", bool, False, "accepted; taskd runs the script with python -u in a new process, as without "
            "the flag", flags=("--run-path", "--run_path"), scope="flag",
            notice="taskd runs the script in a new interpreter (python -u SCRIPT), as without the flag"),
    Setting("standalone", bool, False, "a one-node job with its own embedded controller on localhost (taskd's "
            "default when no --server is given); any --rdzv-* value is ignored, as torchrun does",
            flags=("--standalone",), scope="flag"),
    Setting("rdzv_endpoint", str, None, "under taskd: where node 0's ranks meet, i.e. MASTER_ADDR and MASTER_PORT "
            "(port default 29500) unless --master-addr/--master-port are given. The controller is --server",
            optional=True, flags=("--rdzv-endpoint", "--rdzv_endpoint"), scope="flag", metavar="HOST[:PORT]"),
    Setting("rdzv_id", str, None, "the job id (same as --job-id)", optional=True, flags=("--rdzv-id", "--rdzv_id"),
            scope="flag", metavar="ID"),
    Setting("module", bool, False, "run SCRIPT as a module: python -m SCRIPT ARGS", flags=("-m", "--module"),
            scope="flag"),
    Setting("no_python", bool, False, "run SCRIPT as a command, without python in front",
            flags=("--no-python", "--no_python"), scope="flag"),
    Setting("redirects", str, None, "send stdout (1), stderr (2) or both (3) only to the log file, for all local "
            "ranks or per local rank (e.g. 0:3,1:0); a temporary --log-dir is made when none is given", optional=True,
            flags=("-r", "--redirects"), scope="flag", metavar="0-3|LR:0-3,..."),
    Setting("tee", str, None, "as --redirects, but also echo on the console", optional=True, flags=("-t", "--tee"),
            scope="flag", metavar="0-3|LR:0-3,..."),
    Setting("local_ranks_filter", str, None, "show only these local ranks' output on the console (logs keep "
            "everything)", optional=True, flags=("--local-ranks-filter", "--local_ranks_filter"), scope="flag",
            metavar="LR,..."),
    Setting("shutdown_timeout", float, None, "torchrun's name for --stop-grace", optional=True,
            flags=("--shutdown-timeout", "--shutdown_timeout"), scope="flag", metavar="S"),
    # taskd.client's options (ClientOptions, the `DLRecoverManager`/`RecoverClient` constructor; docs/client.md)
    Setting("call_timeout", float, 10.0, "deadline of every unary call", _POSITIVE, scope="client"),
    Setting("init_attempts", int, 30, "bound of `init_clusterd`'s retries (with `init_timeout`, whichever comes "
            "first)", Bound(1), scope="client"),
    Setting("init_timeout", float, 120.0, "bound of `init_clusterd`'s retries in seconds (with `init_attempts`)",
            _POSITIVE, scope="client"),
    Setting("backoff_initial", float, 0.5, "first pause of the capped exponential backoff, with jitter, between Init "
            "retries, report re-sends and stream reconnects", _POSITIVE, scope="client"),
    Setting("backoff_max", float, 10.0, "the backoff's cap (at least `backoff_initial`)", _POSITIVE, scope="client"),
    Setting("report_timeout", float, 30.0, "overall deadline of one `report_*` call, its re-sends and pauses included "
            "(see [Reports](#reports))", _POSITIVE, scope="client"),
    Setting("liveness_timeout", float, 15.0, "a stream with no signal (the controller sends a keep-alive every 5 s) "
            "for this long is reopened; 0 disables. Time spent in a handler does not count as silence: the timeout "
            "restarts when the handler returns", _NONNEGATIVE, scope="client"),
    Setting("wait_for_ready", bool, True, "calls wait (within their deadline) for a reconnecting channel instead of "
            "failing at once; so a report made while the controller restarts goes through", scope="client"),
    # a variable alone (no flag, no config field): read with `env_text` where it is used
    Setting("rdzv_store", str, "auto", "where a live-recovery job's rendezvous store runs: `auto` (node 0's agent "
            "hosts it, as torchrun's does), `agent` (always), `rank` (rank 0's `init_process_group`)",
            env="TASKD_RDZV_STORE", scope="variable"),
    Setting("preimport", str, "", "modules a warm spare imports before it becomes a rank (comma-separated; a live "
            "job's default: torch and taskd.worker.torch)", env="TASKD_PREIMPORT", scope="variable"),
    Setting("pyspy", str, "1", "`0`: a hung rank's stacks are never taken with py-spy, even when it is installed "
            "(faulthandler's are)", env="TASKD_PYSPY", scope="variable"),
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


def env_item(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(the variable, its text stripped) of a setting: its `env`, else the first of its `env_aliases` that is set;
    ("", "") when none is. The table's reader for a TASKD_*/MINDX_* variable read outside a config's `from_env`."""
    s = setting(name)
    if not s.env:
        raise KeyError(f"setting {name!r} has no variable in taskd/settings.py")
    env = os.environ if environ is None else environ
    for var in (s.env, *s.env_aliases):
        if text := env.get(var, "").strip():
            return var, text
    return "", ""


def env_text(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The text of a setting's variable, stripped ("" when unset); each caller parses it as it documents."""
    return env_item(name, environ)[1]


def _check(settings: tuple[Setting, ...]) -> None:
    """At import: a table that contradicts itself fails every command, not one user's run."""
    seen: set[str] = set()
    for s in settings:
        names = [s.name, *s.flags, *([s.env] if s.env else []), *s.env_aliases]
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
        assert all(f.startswith(("--", "-")) for f in s.flags), f"{s.name}: flags are options"
        assert s.scope in SCOPES, f"{s.name}: scope {s.scope!r} is not one of {SCOPES}"
        assert s.scope != "flag" or not s.env, f"{s.name}: a flag with a variable is a setting of a config"
        assert s.scope not in ("client", "variable") or not s.flags, f"{s.name}: {s.scope} settings have no flag"
        assert not s.flags or s.help or s.doc or s.notice, f"{s.name}: a flag needs its help line"
        assert not s.help or s.env and s.agent, f"{s.name}: one text (doc) unless msrun's table shows the variable's"


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
