"""`taskd run`'s flags: torchrun's, in both spellings and with torchrun's meanings, plus taskd's own.

The parser only maps flags to names: every flag is read as text (default None = "not given") and
RunConfig.from_args parses and checks them all at once, so one run reports every problem and can
tell a flag the user typed from a default or a value taken from the environment.
"""

from __future__ import annotations

import argparse

from taskd.settings import setting

# One line each for flags that have no effect under taskd; printed when such a flag is given.
NOTICES = {
    "rdzv_backend": "taskd has no rendezvous backend: nodes join through the job's controller (node 0's, on the "
                    "port after --rdzv-endpoint's, or --server), so the backend is not used",
    "rdzv_conf": "taskd has no rendezvous: of its settings only join_timeout is used (how long a node waits "
                 "for the job's other nodes); the others are not (timeouts: --heartbeat-timeout, --stop-grace)",
    "start_method": "taskd always starts each rank as a new process (as torchrun's spawn)",
    "event_log_handler": "taskd prints one line per event on stderr and keeps the history in its controller "
                         "(taskd status); torch's event handlers are not called",
    "logs_specs": "taskd writes <log-dir>/rank_<N>.log itself; a LogsSpecs class is not loaded",
    "numa_binding": "taskd does not bind ranks to NUMA nodes; use numactl in the command, or --no-python",
    "signals_to_handle": "taskd stops the ranks on SIGTERM, SIGINT and SIGHUP (SIGTERM, then SIGKILL after "
                         "--stop-grace); other signals are not forwarded",
    "duplicate_stdout_filters": "not supported: filter the rank logs (--log-dir) instead",
    "duplicate_stderr_filters": "not supported: filter the rank logs (--log-dir) instead",
    "virtual_local_rank": "not supported: LOCAL_RANK stays the rank's index on its node and "
                          "CUDA_VISIBLE_DEVICES is left as it is",
    "local_addr": "not used: an agent reaches the controller and reports this host's name",
    "run_path": "taskd runs the script in a new interpreter (python -u SCRIPT), as without the flag",
}


def _flag(group: argparse._ArgumentGroup, *names: str, **kwargs: object) -> None:
    """A flag that defaults to None, so that "not given" is visible to RunConfig."""
    group.add_argument(*names, default=None, **kwargs)  # type: ignore[arg-type]


def _setting(group: argparse._ArgumentGroup, name: str, **kwargs: object) -> None:
    """The flag of a setting of taskd/settings.py, under the spellings its table gives."""
    _flag(group, *setting(name).flags, dest=setting(name).run, **kwargs)


def _d(name: str) -> str:
    """A setting's default as --help shows it."""
    value = setting(name).default
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Every torchrun flag plus taskd's own; `parser.set_defaults(_run_usage=...)` lets errors print this usage."""
    size = parser.add_argument_group("job size (torchrun)")
    _setting(size, "node_count", metavar="N|MIN:MAX",
             help=f"nodes in the job (default {_d('node_count')}). The job starts when MAX nodes have joined; with "
                  "MIN < MAX, a lost node not replaced within the controller's --node-rejoin-timeout lets it go on "
                  "with the rest (at least MIN; scale-in, if every rank passes LiveGroup(on_resize=...)), and it "
                  "grows back when a node joins again (docs/pytorch.md)")
    _setting(size, "ranks_per_node", metavar="N|auto|cpu|gpu",
             help=f"ranks on this node (default {_d('ranks_per_node')}): a number; cpu = the CPUs this process may "
                  "use; gpu = the GPUs (CUDA_VISIBLE_DEVICES, else /dev/nvidiaN); auto = gpu if there are any, else "
                  "cpu")
    _setting(size, "node_rank", metavar="R", help=f"this node's rank, 0..nnodes-1 (default {_d('node_rank')})")
    _setting(size, "standby", action="store_true",
             help="taskd: join the job as a spare node (needs --server): start no rank, take over the node rank of "
                  "the first node the controller declares lost, and exit 0 if none is (docs/node-loss.md)")

    where = parser.add_argument_group("where the job meets (torchrun)")
    _flag(where, "--standalone", action="store_true",
          help="a one-node job with its own embedded controller on localhost (taskd's default when no "
               "--server is given); any --rdzv-* value is ignored, as torchrun does")
    _flag(where, "--rdzv-endpoint", "--rdzv_endpoint", metavar="HOST[:PORT]",
          help="under taskd: where node 0's ranks meet, i.e. MASTER_ADDR and MASTER_PORT (port default 29500) "
               "unless --master-addr/--master-port are given. The controller is --server")
    _flag(where, "--rdzv-id", "--rdzv_id", metavar="ID", help="the job id (same as --job-id)")
    _flag(where, "--rdzv-backend", "--rdzv_backend", metavar="NAME",
          help="accepted; taskd has no rendezvous (nodes join through the controller)")
    _flag(where, "--rdzv-conf", "--rdzv_conf", metavar="K=V,...",
          help="join_timeout=SECONDS: how long a node of a multi-node job waits for the others to join before it "
               f"gives up, starting no rank (default ${setting('join_timeout').env}, else {_d('join_timeout')}, as "
               "torchrun); other keys are accepted and not used")
    _setting(where, "master_addr", metavar="HOST",
             help=f"MASTER_ADDR for the ranks (default {_d('master_addr')}, or node 0's host under Slurm/Kubernetes)")
    _flag(where, "--master-port", "--master_port", metavar="PORT",
          help="MASTER_PORT for the ranks (default: a free port on a one-node job, 29500 otherwise)")
    _flag(where, "--local-addr", "--local_addr", metavar="HOST", help="accepted; not used")
    _setting(where, "server", metavar="HOST:PORT",
             help="taskd: the controller (a `taskd server`) shared by the job's nodes (default "
                  f"${setting('server').env}, else an embedded controller, which only a one-node job can use)")
    _setting(where, "metrics_listen", metavar="HOST[:PORT]",
             help="taskd: serve this node's Prometheus metrics at http://HOST:PORT/metrics (port 9465 if none; "
                  "pip install 'taskd[metrics]'; docs/operations.md)")
    _flag(where, "--token-file", "--token_file", metavar="PATH",
          help="taskd: the controller's token, sent with every call (default $TASKD_TOKEN_FILE; see RELIABILITY.md)")
    _flag(where, "--tls-ca", "--tls_ca", metavar="PEM",
          help="taskd: trust this CA for a TLS controller (default $TASKD_TLS_CA)")
    _flag(where, "--tls-cert", "--tls_cert", metavar="PEM",
          help="taskd: client certificate for a controller that requires one (default $TASKD_TLS_CERT)")
    _flag(where, "--tls-key", "--tls_key", metavar="PEM", help="taskd: its key (default $TASKD_TLS_KEY)")
    _setting(where, "job_id", metavar="ID",
             help=f"taskd: job id shared by every node (default: ${setting('job_id').env}, $SLURM_JOB_ID or a "
                  "generated one)")

    what = parser.add_argument_group("what to run (torchrun)")
    _flag(what, "-m", "--module", action="store_true", help="run SCRIPT as a module: python -m SCRIPT ARGS")
    _flag(what, "--no-python", "--no_python", action="store_true",
          help="run SCRIPT as a command, without python in front")
    _flag(what, "--run-path", "--run_path", action="store_true",
          help="accepted; taskd runs the script with python -u in a new process, as without the flag")
    _setting(what, "role", metavar="NAME", help=f"the ranks' role, ROLE_NAME (default {_d('role')!r})")

    logs = parser.add_argument_group("logs (torchrun)")
    _setting(logs, "log_dir", metavar="DIR", help="per-rank logs <DIR>/rank_<N>.log, appended across restarts")
    _flag(logs, "-r", "--redirects", metavar="0-3|LR:0-3,...",
          help="send stdout (1), stderr (2) or both (3) only to the log file, for all local ranks or per local "
               "rank (e.g. 0:3,1:0); a temporary --log-dir is made when none is given")
    _flag(logs, "-t", "--tee", metavar="0-3|LR:0-3,...", help="as --redirects, but also echo on the console")
    _flag(logs, "--local-ranks-filter", "--local_ranks_filter", metavar="LR,...",
          help="show only these local ranks' output on the console (logs keep everything)")
    _setting(logs, "quiet", action="store_true", help="taskd: do not echo rank output on the console")

    recovery = parser.add_argument_group("recovery")
    _setting(recovery, "max_restarts", metavar="K",
             help=f"restarts the job may use before it fails (default {_d('max_restarts')}; torchrun's default is 0)")
    _setting(recovery, "monitor_interval", metavar="S",
             help=f"slow sweep for what pidfds cannot tell, e.g. hangs (default {_d('monitor_interval')}); a rank's "
                  "exit is seen at once")
    _setting(recovery, "stop_grace", metavar="S",
             help=f"taskd: SIGTERM to SIGKILL when stopping ranks (default {_d('stop_grace')})")
    _flag(recovery, "--shutdown-timeout", "--shutdown_timeout", metavar="S", help="torchrun's name for --stop-grace")
    _setting(recovery, "strategies", metavar="LIST",
             help="taskd: recovery strategies offered, in order (default recover,job-rescheduling,exit)")
    _setting(recovery, "heartbeat_timeout", metavar="S",
             help="taskd: a rank whose last taskd.worker.heartbeat() is older is hung (default: off)")
    _setting(recovery, "straggler_factor", metavar="F",
             help="taskd: report a rank whose compute time per step (outside collectives) is F times the median of "
                  "the other ranks' (default: off; docs/operations.md)")
    _setting(recovery, "straggler_interval", metavar="S",
             help=f"taskd: seconds between pace reports with --straggler-factor (default {_d('straggler_interval')})")
    _setting(recovery, "dump_timeout", metavar="S",
             help=f"taskd: how long the dump strategy waits for ranks to save (default {_d('dump_timeout')})")
    _setting(recovery, "warm_spares", metavar="N",
             help="taskd: Python interpreters kept ready to become a restarted rank (.py scripts; default "
                  f"{_d('warm_spares')})")
    _setting(recovery, "warm_spare_mode", metavar="import|script",
             help="taskd: import: a spare has imported the framework; script: it has also run the script up to "
                  "LiveGroup() / taskd.worker.become_rank(), so a replacement's model is built before the fault "
                  f"(default {_d('warm_spare_mode')}; docs/worker.md)")

    _setting(recovery, "snapshot_memory", metavar="BYTES",
             help="taskd: memory for the ranks' in-memory snapshots on this node (512M, 2G; 0: off; default: half of "
                  "/dev/shm; docs/worker.md)")
    _setting(recovery, "snapshot_persist_dir", metavar="DIR",
             help="taskd: the agent copies the snapshots here in the background, every --snapshot-persist-every "
                  "steps and at the job's end; a restore falls back to them (default: off)")
    _setting(recovery, "snapshot_persist_every", metavar="N",
             help=f"taskd: persist every Nth step's snapshot (default {_d('snapshot_persist_every')})")
    _setting(recovery, "snapshot_persist_keep", metavar="K",
             help=f"taskd: persisted steps kept per rank (default {_d('snapshot_persist_keep')})")

    accepted = parser.add_argument_group("accepted for torchrun's command lines (a notice says what taskd does)")
    _flag(accepted, "--start-method", "--start_method", metavar="spawn|fork|forkserver")
    _flag(accepted, "--event-log-handler", "--event_log_handler", metavar="NAME")
    _flag(accepted, "--logs-specs", "--logs_specs", metavar="NAME")
    _flag(accepted, "--numa-binding", "--numa_binding", metavar="MODE")
    _flag(accepted, "--signals-to-handle", "--signals_to_handle", metavar="SIGS")
    _flag(accepted, "--duplicate-stdout-filters", "--duplicate_stdout_filters", metavar="F,...")
    _flag(accepted, "--duplicate-stderr-filters", "--duplicate_stderr_filters", metavar="F,...")
    _flag(accepted, "--virtual-local-rank", "--virtual_local_rank", action="store_true")

    parser.add_argument("script", metavar="SCRIPT", help="a Python script, a module (-m) or a command (--no-python)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    parser.set_defaults(_run_usage=parser.format_usage)


# The flag a dest came from, for error messages (the dash spelling, as --help shows it).
FLAG_NAMES = {
    "module": "-m/--module", "redirects": "-r/--redirects", "tee": "-t/--tee", "script": "SCRIPT",
}


def flag_name(dest: str) -> str:
    return FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))
