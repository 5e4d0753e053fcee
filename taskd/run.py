"""`taskd run` / `python -m taskd.run`: torchrun's shape, taskd's recovery.

Parses flags into a WorkerSpec (the launcher) and agent settings (the plugin), runs the job
through MSRunPlugin with the launcher's callbacks, prints the summary and exits with the
job's code (0, or the first failing rank's code; 128 + signal for a signal).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import uuid

from taskd.vocabulary import parse_strategies

log = logging.getLogger("taskd.run")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, metavar="N",
                        help="ranks on this node (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, metavar="N", help="nodes in the job (default 1)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, metavar="R",
                        help="this node's rank (default 0)")
    parser.add_argument("--job-id", default=None, metavar="ID",
                        help="job id shared by every node (default: $MINDX_TASK_ID or a generated one)")
    parser.add_argument("--server", default=None, metavar="HOST:PORT",
                        help="controller address (default: $MINDX_SERVER_IP, else an embedded controller)")
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=3, metavar="K",
                        help="restarts the job may use before it fails (default 3)")
    parser.add_argument("--strategies", default=None, metavar="LIST",
                        help="recovery strategies offered, in order (default recover,job-rescheduling,exit)")
    parser.add_argument("--log-dir", "--log_dir", default=None, metavar="DIR",
                        help="per-rank logs, appended across restarts")
    parser.add_argument("--monitor-interval", type=float, default=1.0, metavar="S",
                        help="slow sweep for what pidfds cannot tell (default 1.0)")
    parser.add_argument("--stop-grace", type=float, default=5.0, metavar="S",
                        help="SIGTERM to SIGKILL when stopping ranks (default 5)")
    parser.add_argument("--heartbeat-timeout", type=float, default=None, metavar="S",
                        help="a rank whose last taskd.worker.heartbeat() is older is hung (default: off)")
    parser.add_argument("--dump-timeout", type=float, default=30.0, metavar="S",
                        help="how long the dump strategy waits for ranks to save (default 30)")
    parser.add_argument("--warm-spares", type=int, default=0, metavar="N",
                        help="Python interpreters kept ready to become a restarted rank (.py scripts; default 0)")
    parser.add_argument("--master-addr", default="127.0.0.1", help="MASTER_ADDR for the ranks")
    parser.add_argument("--master-port", type=int, default=0, help="MASTER_PORT for the ranks (0 = a free port)")
    parser.add_argument("--quiet", action="store_true", help="do not echo rank output on the console")
    parser.add_argument("script", metavar="SCRIPT", help="a Python script or an executable")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")


def _server(args: argparse.Namespace) -> str | None:
    return args.server or os.environ.get("MINDX_SERVER_IP") or None


def check_arguments(args: argparse.Namespace) -> list[str]:
    """Everything wrong with the flags, found before any process starts (one line each)."""
    from taskd.toolkit.recover_module.channel import normalize_address
    from taskd.toolkit.recover_module.errors import ConfigurationError

    problems = [f"--{name.replace('_', '-')} must be >= 1" for name in ("nproc_per_node", "nnodes")
                if getattr(args, name) < 1]
    if args.nnodes >= 1 and not 0 <= args.node_rank < args.nnodes:
        problems.append(f"--node-rank must be in [0, {args.nnodes - 1}]")
    problems += [f"--{name.replace('_', '-')} must be >= 0" for name in ("max_restarts", "warm_spares", "stop_grace")
                 if getattr(args, name) < 0]
    problems += [f"--{name.replace('_', '-')} must be > 0" for name in ("monitor_interval", "dump_timeout",
                                                                         "heartbeat_timeout")
                 if getattr(args, name) is not None and not getattr(args, name) > 0]
    if not 0 <= args.master_port <= 65535:
        problems.append("--master-port must be in [0, 65535]")
    try:
        if args.strategies:
            parse_strategies(args.strategies)
    except ValueError as exc:
        problems.append(f"--strategies: {exc}")
    server = _server(args)
    if server:
        try:
            normalize_address(server)
        except ConfigurationError as exc:
            source = "--server" if args.server else "MINDX_SERVER_IP"
            problems.append(f"{source}: {exc}")
    if args.log_dir:
        try:
            os.makedirs(args.log_dir, exist_ok=True)
        except OSError as exc:
            problems.append(f"--log-dir: cannot create {args.log_dir}: {exc.strerror or exc}")
    script = args.script
    if script.endswith(".py") or os.sep in script:
        if not os.path.exists(script):
            problems.append(f"{script}: no such file")
    elif shutil.which(script) is None:
        problems.append(f"{script}: no such file or command on PATH")
    return problems


def run_main(args: argparse.Namespace) -> int:
    """Run one job; returns the process exit code."""
    from taskd.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin
    from taskd.launcher import LocalLauncher, WorkerSpec, command_for

    problems = check_arguments(args)
    if problems:
        sys.stderr.write("".join(f"taskd run: {p}\n" for p in problems))
        return 2  # a usage error, like argparse's own
    strategies = parse_strategies(args.strategies) if args.strategies else None
    script = args.script
    job_id = args.job_id or os.environ.get("MINDX_TASK_ID") or f"taskd-{uuid.uuid4().hex[:8]}"
    server = _server(args)
    spec = WorkerSpec(
        entrypoint=command_for(script, args.script_args),
        nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, job_id=job_id,
        log_dir=args.log_dir, console=not args.quiet, warm_spares=args.warm_spares,
    )
    launcher = LocalLauncher(spec)
    try:
        plugin = MSRunPlugin(
            details=launcher, launcher="taskd", job_id=job_id, server=server, node_rank=args.node_rank,
            node_count=args.nnodes, ranks_per_node=args.nproc_per_node, strategies=strategies,
            max_restarts=args.max_restarts, monitor_interval=args.monitor_interval, stop_grace=args.stop_grace,
            heartbeat_timeout=args.heartbeat_timeout, log_dir=args.log_dir, dump_timeout=args.dump_timeout,
        )
        for name, func in launcher.callbacks().items():
            plugin.register_callbacks(name, func)
        result = plugin.run()
    finally:
        launcher.close(args.stop_grace)
    return result.exit_code


# Loggers whose INFO lines are the user's "one line per event"; the rest speak up at WARNING.
EVENT_LOGGERS = ("taskd.agent", "taskd.run")


def setup_console_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[taskd %(asctime)s] %(message)s", "%H:%M:%S"))
    root = logging.getLogger("taskd")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in EVENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="taskd run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    setup_console_logging()
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())
