"""`taskd server` and `taskd status`: flags -> ControllerConfig / a status query. taskd/cli.py calls these."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import grpc

from taskd.vocabulary import DEFAULT_PORT

log = logging.getLogger(__name__)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    d = _defaults()
    parser.add_argument("--listen", default=d.listen, metavar="HOST:PORT",
                        help=f"address to serve on: HOST:PORT, [IPV6]:PORT, a bare IPv6 address or HOST (default "
                             f"{d.listen}; port 0 = any free port)")
    parser.add_argument("--state", default=None, metavar="PATH",
                        help="SQLite state file (default: $XDG_DATA_HOME/taskd/controller.sqlite3); ':memory:' keeps "
                             "nothing")
    parser.add_argument("--keepalive-interval", type=float, default=d.keepalive_interval, metavar="SECONDS")
    parser.add_argument("--stop-timeout", type=float, default=d.stop_timeout, metavar="SECONDS",
                        help="wait for every agent's stop-complete")
    parser.add_argument("--strategy-timeout", type=float, default=d.strategy_timeout, metavar="SECONDS",
                        help="wait for every agent's supported strategies")
    parser.add_argument("--recover-timeout", type=float, default=d.recover_timeout, metavar="SECONDS",
                        help="wait for every agent's recover status")
    parser.add_argument("--resume-timeout", type=float, default=d.resume_timeout, metavar="SECONDS",
                        help="after a controller restart, wait this long for the agents of a job caught mid-round "
                             "to resubscribe before its round goes on without the missing ones")
    parser.add_argument("--settle-window", type=float, default=d.settle_window, metavar="SECONDS",
                        help="a fault this soon after a successful recover counts as that recover failing")
    parser.add_argument("--agent-loss-timeout", type=float, default=d.agent_loss_timeout, metavar="SECONDS",
                        help="an agent whose signal stream closed and that does not come back (nor report that it "
                             "finished) within this fails its job; the other agents are told to exit")
    parser.add_argument("--max-restarts", type=int, default=d.default_max_restarts, metavar="N",
                        help="restart budget of a job that does not send its own")
    parser.add_argument("--max-jobs", type=int, default=d.max_jobs, metavar="N",
                        help=f"jobs kept at once (default {d.max_jobs}); a full table evicts the finished job idle "
                             "the longest, and refuses a new job only when all N are still running")
    parser.add_argument("--finished-job-retention", type=float, default=d.finished_job_retention, metavar="SECONDS",
                        help=f"forget a finished job (and its history) once no agent has streamed or called for it "
                             f"this long (default {d.finished_job_retention:g})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _defaults():  # noqa: ANN202 - avoid importing grpc.aio machinery at parser build time
    from taskd.controller.server import ControllerConfig

    return ControllerConfig()


def _positive(name: str, value: float) -> str:
    return "" if value > 0 else f"--{name} must be > 0, got {value}"


def _listen_error(listen: str) -> str:
    from taskd.controller.server import parse_listen

    try:
        parse_listen(listen)
    except ValueError as exc:
        return f"--listen: {exc}"
    return ""


def server_main(args: argparse.Namespace) -> int:
    from taskd.controller.server import ControllerConfig, run_server

    if not logging.getLogger().handlers:
        logging.basicConfig(level=getattr(logging, args.log_level),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    errors = [e for e in (
        _listen_error(args.listen), _positive("max-jobs", args.max_jobs),
        "" if args.finished_job_retention >= 0 else "--finished-job-retention must be >= 0",
        _positive("keepalive-interval", args.keepalive_interval), _positive("stop-timeout", args.stop_timeout),
        _positive("strategy-timeout", args.strategy_timeout), _positive("recover-timeout", args.recover_timeout),
        _positive("resume-timeout", args.resume_timeout), _positive("agent-loss-timeout", args.agent_loss_timeout),
        "" if args.settle_window >= 0 else "--settle-window must be >= 0",
        "" if args.max_restarts >= 0 else "--max-restarts must be >= 0",
    ) if e]
    if errors:
        sys.stderr.write("taskd server: " + "; ".join(errors) + "\n")
        return 2
    config = ControllerConfig(
        listen=args.listen, state_path=args.state, keepalive_interval=args.keepalive_interval,
        stop_timeout=args.stop_timeout, strategy_timeout=args.strategy_timeout,
        recover_timeout=args.recover_timeout, resume_timeout=args.resume_timeout, settle_window=args.settle_window,
        default_max_restarts=args.max_restarts, agent_loss_timeout=args.agent_loss_timeout,
        max_jobs=args.max_jobs, finished_job_retention=args.finished_job_retention,
    )

    def ready(server) -> None:  # noqa: ANN001
        sys.stdout.write(f"taskd controller listening on {server.address}\n")
        sys.stdout.flush()

    try:
        return run_server(config, ready=ready)
    except OSError as exc:
        sys.stderr.write(f"taskd server: {exc}\n")
        return 1


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get("MINDX_SERVER_IP") or f"127.0.0.1:{DEFAULT_PORT}"
    parser.add_argument("--server", default=default, metavar="ADDR",
                        help=f"controller address host[:port] (default $MINDX_SERVER_IP or 127.0.0.1:{DEFAULT_PORT})")
    parser.add_argument("--job", default=None, metavar="ID", help="only this job")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")


def status_main(args: argparse.Namespace) -> int:
    from taskd.controller.status_view import fetch_jobs, normalize_address, render_json, render_text

    try:
        jobs = fetch_jobs(args.server, args.job, timeout=args.timeout)
    except ValueError as exc:  # a malformed --server / $MINDX_SERVER_IP
        sys.stderr.write(f"taskd status: {exc} (pass --server HOST:PORT or set MINDX_SERVER_IP)\n")
        return 2
    except grpc.RpcError as exc:
        sys.stderr.write(f"taskd status: cannot reach the controller at {normalize_address(args.server)}: "
                         f"{exc.code().name}: {exc.details()}; is `taskd server` running there? (pass --server "
                         f"HOST:PORT or set MINDX_SERVER_IP)\n")
        return 1
    sys.stdout.write(render_json(jobs) if args.json else render_text(jobs))
    return 0 if jobs.status.code == 0 else 1
