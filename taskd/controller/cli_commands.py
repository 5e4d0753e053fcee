"""`taskd server` and `taskd status`: flags -> ControllerConfig / a status query. taskd/cli.py calls these."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import grpc

from taskd.controller.config import TOKEN_ENV
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
                        help="an agent without a signal stream (registered and never subscribed, or after a "
                             "controller restart) that does not subscribe (nor report that it finished) within this "
                             f"is lost: its node-loss round starts (default {d.agent_loss_timeout:g})")
    parser.add_argument("--agent-loss-grace", type=float, default=d.agent_loss_grace, metavar="SECONDS",
                        help="an agent whose signal stream ended and that does not resubscribe within this (at most "
                             f"--agent-loss-timeout) is lost (default {d.agent_loss_grace:g})")
    parser.add_argument("--node-rejoin-timeout", type=float, default=d.node_rejoin_timeout, metavar="SECONDS",
                        help="after a node's agent is lost, wait this long for a replacement agent of that node rank "
                             "(`taskd run --node-rank R`, a restarted pod, or a `taskd run --standby` agent) before "
                             f"the job fails (default {d.node_rejoin_timeout:g}: a pod rescheduled with its image "
                             "pulled)")
    parser.add_argument("--agent-ping-interval", type=float, default=d.agent_ping_interval, metavar="SECONDS",
                        help="PING an agent's connection after this long without a word on it (default "
                             f"{d.agent_ping_interval:g})")
    parser.add_argument("--agent-ping-timeout", type=float, default=d.agent_ping_timeout, metavar="SECONDS",
                        help="a PING unanswered this long closes the agent's connection, so its stream ends: how a "
                             "SIGSTOPped or cut-off agent is found, within interval + timeout + --agent-loss-grace "
                             f"(default {d.agent_ping_timeout:g}; a busy agent still answers)")
    parser.add_argument("--max-standbys", type=int, default=d.max_standbys, metavar="N",
                        help=f"standby agents (`taskd run --standby`) one job may have waiting (default "
                             f"{d.max_standbys}); one more is refused")
    parser.add_argument("--join-timeout", type=float, default=d.join_timeout, metavar="SECONDS",
                        help="a job whose nodes have not all registered this long after its first agent did fails "
                             "(naming the missing nodes) and the agents that joined are told to exit; torchrun's "
                             f"rendezvous join_timeout (default {d.join_timeout:g})")
    parser.add_argument("--max-restarts", type=int, default=d.default_max_restarts, metavar="N",
                        help="restart budget of a job that does not send its own")
    parser.add_argument("--max-jobs", type=int, default=d.max_jobs, metavar="N",
                        help=f"jobs kept at once (default {d.max_jobs}); a full table evicts the finished job idle "
                             "the longest, and refuses a new job only when all N are still running")
    parser.add_argument("--finished-job-retention", type=float, default=d.finished_job_retention, metavar="SECONDS",
                        help=f"forget a finished job (and its history) once no agent has streamed or called for it "
                             f"this long (default {d.finished_job_retention:g})")
    parser.add_argument("--unregistered-job-timeout", type=float, default=d.unregistered_job_timeout,
                        metavar="SECONDS", help="drop a job that no agent has registered for this long after its Init "
                                                f"(default {d.unregistered_job_timeout:g})")
    parser.add_argument("--token-file", default=os.environ.get(TOKEN_ENV) or None, metavar="PATH",
                        help=f"every call must carry the token in this file (default ${TOKEN_ENV}); clients read it "
                             f"from {TOKEN_ENV} or their --token-file. Needed to serve a non-loopback address")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate (chain)")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default=None, metavar="PEM",
                        help="require client certificates signed by this CA (mTLS)")
    parser.add_argument("--insecure", action="store_true",
                        help="serve a non-loopback address without a token: anyone who can reach it can read, fail "
                             "or stop every job. For ClusterD-wire clients that send no token, on a trusted network")
    parser.add_argument("--max-node-count", type=int, default=d.max_node_count, metavar="N",
                        help=f"refuse jobs with more nodes (default {d.max_node_count})")
    parser.add_argument("--max-ranks", type=int, default=d.max_ranks, metavar="N",
                        help=f"refuse jobs with more ranks, and bound the rank ids and list sizes of a job whose Init "
                             f"gives no ranksPerNode (ClusterD-wire clients) by it (default {d.max_ranks})")
    parser.add_argument("--max-job-bytes", type=int, default=d.max_job_bytes, metavar="BYTES",
                        help=f"bytes one job may hold in the state file, its snapshot and history (default "
                             f"{d.max_job_bytes}; 0 = no quota): a change past it is refused (413) and nothing changes")
    parser.add_argument("--max-job-log-lines", type=int, default=d.max_job_log_lines, metavar="N",
                        help=f"history log lines per job every 10 s (default {d.max_job_log_lines}; 0 = no limit); "
                             "the lines held back are counted in the job's next one")
    parser.add_argument("--max-connections", type=int, default=None, metavar="N",
                        help="connections accepted at once (default: the open-file limit, raised to its hard limit, "
                             "minus a reserve)")
    parser.add_argument("--max-connections-per-peer", type=int, default=d.max_connections_per_peer, metavar="N",
                        help=f"connections with a call in flight per client IP (default {d.max_connections_per_peer}; "
                             "0 = no limit; loopback clients are exempt unless --limit-loopback)")
    parser.add_argument("--max-connections-per-credential", type=int, default=None, metavar="N",
                        help="connections one credential (a job's, or the admin token) may hold, idle or not "
                             "(default: a quarter of --max-connections; 0 = no limit); past it its longest-idle one is "
                             "closed, or the call refused when all have calls in flight")
    parser.add_argument("--max-streams-per-peer", type=int, default=d.max_streams_per_peer, metavar="N",
                        help=f"open signal streams per client IP (default {d.max_streams_per_peer}; 0 = no limit)")
    parser.add_argument("--max-calls-per-second", type=float, default=d.calls_per_second_per_peer, metavar="RATE",
                        help=f"calls per second per client IP (default {d.calls_per_second_per_peer:g}; 0 = no limit)")
    parser.add_argument("--call-burst", type=int, default=d.call_burst_per_peer, metavar="N",
                        help=f"calls a client IP may make at once above the rate (default {d.call_burst_per_peer})")
    parser.add_argument("--limit-loopback", action="store_true",
                        help="apply the per-client limits to clients on this host too")
    parser.add_argument("--idle-timeout", type=float, default=d.idle_timeout, metavar="SECONDS",
                        help=f"close a connection without a call for this long (default {d.idle_timeout:g})")
    parser.add_argument("--handshake-timeout", type=float, default=d.handshake_timeout, metavar="SECONDS",
                        help=f"close a connection still without its handshake (default {d.handshake_timeout:g})")
    parser.add_argument("--auth-timeout", type=float, default=d.auth_timeout, metavar="SECONDS",
                        help=f"close a connection that carried no call with the token this long after it opened "
                             f"(default {d.auth_timeout:g}; 0 = never)")
    parser.add_argument("--metrics-listen", default=None, metavar="HOST[:PORT]",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (port 9464 if none; needs "
                             "pip install 'taskd[metrics]'; docs/operations.md lists them)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _defaults():  # noqa: ANN202 - avoid importing grpc.aio machinery at parser build time
    from taskd.controller.config import ControllerConfig

    return ControllerConfig()


def server_config(args: argparse.Namespace):  # noqa: ANN201 - ControllerConfig, imported late
    """Flags -> ControllerConfig, through `FLAGS` (field -> flag): a new `taskd server` flag is its
    `add_argument` above and one line there. ConfigError (a ValueError) names each bad field and its flag."""
    from taskd.controller.config import FLAGS, ControllerConfig

    return ControllerConfig(**{name: getattr(args, flag_dest(flag)) for name, flag in FLAGS.items()})


def flag_dest(flag: str) -> str:
    """"--max-calls-per-second" -> "max_calls_per_second", the argparse name of a ControllerConfig.FLAGS entry."""
    return flag.split()[0].lstrip("-").replace("-", "_")


def server_main(args: argparse.Namespace) -> int:
    from taskd.controller.config import ConfigError
    from taskd.controller.server import run_server

    if not logging.getLogger().handlers:
        logging.basicConfig(level=getattr(logging, args.log_level),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = server_config(args)
    except ConfigError as exc:
        sys.stderr.write("taskd server: " + "\n  ".join(["invalid configuration:", *exc.problems]) + "\n")
        return 2

    def ready(server) -> None:  # noqa: ANN001
        sys.stdout.write(f"taskd controller listening on {server.address}\n")
        sys.stdout.flush()

    try:
        return run_server(config, ready=ready)
    except (OSError, ValueError) as exc:  # a bind, TLS or state file that fails; a token file changed since
        sys.stderr.write(f"taskd server: {exc}\n")
        return 1


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", required=True, metavar="ID", help="the job the credential is for (its --run-id / "
                        "MINDX_TASK_ID, what its agents send as jobId)")
    parser.add_argument("--token-file", default=os.environ.get(TOKEN_ENV) or None, metavar="PATH",
                        help=f"the controller's admin token, as given to `taskd server --token-file` (default "
                             f"${TOKEN_ENV})")


def token_main(args: argparse.Namespace) -> int:
    """Print the job's credential: `taskd token --job j1 > j1.cred; chmod 600 j1.cred`. Only the token file is
    needed (no controller call): the credential is an HMAC of the job id under the admin token."""
    from taskd.controller.auth import JOB_PREFIX, job_credential
    from taskd.controller.config import read_token
    from taskd.controller.validation import check_job_id

    if args.token_file is None:
        sys.stderr.write(f"taskd token: give --token-file (or {TOKEN_ENV}): the admin token the controller was "
                         "started with\n")
        return 2
    if why := check_job_id(args.job):
        sys.stderr.write(f"taskd token: --job: {why}\n")
        return 2
    try:
        admin = read_token(args.token_file)
    except ValueError as exc:
        sys.stderr.write(f"taskd token: {exc}\n")
        return 2
    if admin.startswith(JOB_PREFIX):
        sys.stderr.write(f"taskd token: {args.token_file} holds a job credential, not the admin token: only the admin "
                         "token mints credentials\n")
        return 2
    sys.stdout.write(job_credential(admin, args.job) + "\n")
    return 0


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=os.environ.get("MINDX_SERVER_IP") or None, metavar="ADDR",
                        help="controller address host[:port] (default $MINDX_SERVER_IP; else every `taskd run` of "
                             f"this user on this host that runs its own controller, else 127.0.0.1:{DEFAULT_PORT})")
    parser.add_argument("--job", default=None, metavar="ID", help="only this job")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    env = os.environ
    parser.add_argument("--token-file", default=env.get(TOKEN_ENV) or None, metavar="PATH",
                        help=f"send the token in this file (default ${TOKEN_ENV})")
    parser.add_argument("--tls-ca", default=env.get("TASKD_TLS_CA") or None, metavar="PEM",
                        help="connect with TLS, trusting this CA (default $TASKD_TLS_CA)")
    parser.add_argument("--tls-cert", default=env.get("TASKD_TLS_CERT") or None, metavar="PEM",
                        help="client certificate for mTLS (default $TASKD_TLS_CERT)")
    parser.add_argument("--tls-key", default=env.get("TASKD_TLS_KEY") or None, metavar="PEM",
                        help="its private key (default $TASKD_TLS_KEY)")


UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def status_main(args: argparse.Namespace) -> int:
    from taskd.controller.status_view import fetch_jobs, normalize_address, read_credentials, render_json, render_text

    if args.server is None:
        local = _embedded_jobs(args)
        if local is not None:
            sys.stdout.write(render_json(local) if args.json else render_text(local))
            return 0 if local.jobs or not args.job else 1
        args.server = f"127.0.0.1:{DEFAULT_PORT}"
    try:
        token, credentials = read_credentials(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)
        jobs = fetch_jobs(args.server, args.job, timeout=args.timeout, token=token, credentials=credentials)
    except ValueError as exc:  # a malformed --server / $MINDX_SERVER_IP, an unreadable credential file
        sys.stderr.write(f"taskd status: {exc} (pass --server HOST:PORT or set MINDX_SERVER_IP)\n")
        return 2
    except grpc.RpcError as exc:
        where = normalize_address(args.server)
        if exc.code() in UNREACHABLE:
            sys.stderr.write(f"taskd status: cannot reach the controller at {where}: {exc.code().name}: "
                             f"{exc.details()}; is `taskd server` running there? (pass --server HOST:PORT or set "
                             "MINDX_SERVER_IP; a TLS server needs --tls-ca; a `taskd run` without --server is found "
                             "without any, by the same user on the same host)\n")
        else:
            hint = {grpc.StatusCode.UNAUTHENTICATED: f" (pass --token-file or set {TOKEN_ENV})",
                    grpc.StatusCode.RESOURCE_EXHAUSTED: " (the controller limits calls per client; retry shortly)",
                    }.get(exc.code(), "")
            sys.stderr.write(f"taskd status: the controller at {where} answered but refused the query: "
                             f"{exc.code().name}: {exc.details()}{hint}\n")
        return 1
    sys.stdout.write(render_json(jobs) if args.json else render_text(jobs))
    return 0 if jobs.status.code == 0 else 1


def _embedded_jobs(args: argparse.Namespace):  # noqa: ANN202 - a taskd_pb2.JobList, or None
    """The jobs of this user's `taskd run`s that run their own controller on this host (controller/locator.py),
    merged; None when there is none, so that the default address is asked as before."""
    from taskd.controller.locator import live_locators
    from taskd.controller.status_view import fetch_jobs
    from taskd.proto import taskd_pb2
    from taskd.vocabulary import Code

    locators = live_locators()
    if not locators:
        return None
    merged = taskd_pb2.JobList()
    for loc in locators:
        try:
            found = fetch_jobs(loc.address, args.job, timeout=args.timeout, token=loc.token)
        except grpc.RpcError as exc:  # it is stopping: its jobs are over
            logging.getLogger(__name__).debug("embedded controller %s (pid %d): %s", loc.address, loc.pid, exc)
            continue
        if found.status.code == 0:
            merged.jobs.extend(found.jobs)
    if args.job and not merged.jobs:
        merged.status.code = Code.JOB_NOT_EXIST  # what one controller answers for an unknown job id
        merged.status.info = f"no job {args.job!r} in the {len(locators)} `taskd run`(s) of this user on this host"
    return merged
