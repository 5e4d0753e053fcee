"""`taskd run` / `python -m taskd.run`: torchrun's shape, taskd's recovery.

Parses flags into a WorkerSpec (the launcher) and an AgentConfig (the agent), runs the job
with the agent on the launcher's callbacks, prints the summary and exits with the job's
code (0, or the first failing rank's code; 128 + signal for a signal).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from typing import TYPE_CHECKING

from taskd.agent.console import EVENT_LOGGERS, setup_console_logging  # noqa: F401 (taskd run's console)
from taskd.vocabulary import parse_strategies

if TYPE_CHECKING:
    from taskd.controller.server import EmbeddedController

log = logging.getLogger("taskd.run")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's flags (both spellings, torchrun's meanings) and taskd's own; see taskd.run_config."""
    from taskd.run_config import add_run_arguments as add

    add(parser)


def _server(args: argparse.Namespace) -> str | None:
    config = getattr(args, "config", None)
    if config is not None:  # resolved by RunConfig (--standalone ignores MINDX_SERVER_IP)
        return config.server
    return args.server or os.environ.get("MINDX_SERVER_IP") or None


def check_arguments(args: argparse.Namespace) -> list[str]:
    """Everything wrong with the flags, found before any process starts (one line each)."""
    from taskd.run_config import RunConfig, RunConfigError

    if getattr(args, "config", None) is not None:
        return []  # RunConfig.namespace(): checked when the RunConfig was built
    try:
        RunConfig.from_args(args)
    except RunConfigError as exc:
        return exc.problems
    return []


# Where each agent setting comes from on taskd run's command line: a bad value's error names the flag.
AGENT_FLAGS = {
    "job_id": "--job-id", "server": "--server", "node_rank": "--node-rank", "node_count": "--nnodes",
    "ranks_per_node": "--nproc-per-node", "strategies": "--strategies", "max_restarts": "--max-restarts",
    "monitor_interval": "--monitor-interval", "stop_grace": "--stop-grace", "heartbeat_timeout": "--heartbeat-timeout",
    "log_dir": "--log-dir", "dump_timeout": "--dump-timeout",
}


def run_main(args: argparse.Namespace) -> int:
    """Run one job; returns the process exit code.

    `taskd run`'s composition root: it builds the launcher, the agent and (with no controller
    address) the embedded controller, and hands the launcher and the controller to the agent.
    """
    import taskd.client  # noqa: F401 (first: its import switches gRPC fork support off while grpc is not loaded)
    from taskd.agent.config import AgentConfig
    from taskd.agent.supervisor import Supervisor
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
        config = AgentConfig.from_env(
            dict(AGENT_FLAGS, server="--server" if args.server else "MINDX_SERVER_IP"),
            launcher="taskd", job_id=job_id, server=server, node_rank=args.node_rank,
            node_count=args.nnodes, ranks_per_node=args.nproc_per_node, strategies=strategies,
            max_restarts=args.max_restarts, monitor_interval=args.monitor_interval, stop_grace=args.stop_grace,
            heartbeat_timeout=args.heartbeat_timeout, log_dir=args.log_dir, dump_timeout=args.dump_timeout,
        )
        controller = _embedded_controller(config.max_restarts) if config.server is None else None
        result = Supervisor(config, launcher.callbacks(), details=launcher, controller=controller).run()
    finally:
        launcher.close(args.stop_grace)
    return result.exit_code


def _embedded_controller(max_restarts: int) -> EmbeddedController:
    """The controller `taskd run` runs when it is given none: a free loopback port, state in memory."""
    from taskd.controller.server import ControllerConfig, EmbeddedController

    return EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:",
                                               default_max_restarts=max_restarts))


def main(argv: list[str] | None = None) -> int:
    from taskd.run_config import build_or_exit

    parser = argparse.ArgumentParser(prog="taskd run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    setup_console_logging()
    return run_main(build_or_exit(args).namespace())


if __name__ == "__main__":
    sys.exit(main())
