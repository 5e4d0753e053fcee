"""`taskd server`, `status`, `token`, `migrate`: flags (the settings table's rows) -> a config, a query, a call."""

from __future__ import annotations

import argparse
import logging
import sys

import grpc

from taskd.controller.config import TOKEN_ENV
from taskd.server_settings import add_command_flags, add_server_flags, flag_dest
from taskd.vocabulary import DEFAULT_PORT

log = logging.getLogger(__name__)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """`taskd server`'s flags, each a row of taskd/server_settings.py (its default, metavar and help)."""
    add_server_flags(parser)


def server_config(args: argparse.Namespace):  # noqa: ANN201 - ControllerConfig, imported late
    """Flags -> ControllerConfig, through `FLAGS` (field -> flag): a new `taskd server` flag is its
    `add_argument` above and one line there. ConfigError (a ValueError) names each bad field and its flag."""
    from taskd.controller.config import FLAGS, ControllerConfig

    return ControllerConfig(**{name: getattr(args, flag_dest(flag)) for name, flag in FLAGS.items()})


def server_main(args: argparse.Namespace) -> int:
    from taskd.controller.config import ConfigError
    from taskd.controller.service.server import run_server

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
    """`taskd token`'s flags, rows of taskd/server_settings.py's `COMMAND_FLAGS`."""
    add_command_flags(parser, "token")


def token_main(args: argparse.Namespace) -> int:
    """Print the job's credential: `taskd token --job j1 > j1.cred; chmod 600 j1.cred`. Only the token file is
    needed (no controller call): the credential is an HMAC of the job id under the admin token."""
    from taskd.controller.config import read_token
    from taskd.controller.service.auth import JOB_PREFIX, job_credential
    from taskd.controller.service.validation import check_job_id

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
    """`taskd status`'s flags, rows of taskd/server_settings.py's `COMMAND_FLAGS`."""
    add_command_flags(parser, "status")


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


def add_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    """`taskd migrate`'s flags, rows of taskd/server_settings.py's `COMMAND_FLAGS`."""
    add_command_flags(parser, "migrate")


def migrate_main(args: argparse.Namespace) -> int:
    """`taskd migrate --job J --rank R`: 0 once the rank runs in its successor, 1 (with the reason) when the
    migration was refused or called off (the job then runs as it was), 2 for bad arguments."""
    from taskd.controller.service.validation import check_job_id
    from taskd.controller.status_view import normalize_address, read_credentials
    from taskd.proto import taskd_pb2, taskd_pb2_grpc

    if why := check_job_id(args.job):
        sys.stderr.write(f"taskd migrate: --job: {why}\n")
        return 2
    if (args.rank if args.node is None else args.node) < 0 or not 0 < args.timeout <= 3600:
        sys.stderr.write("taskd migrate: --rank and --node must be >= 0 and --timeout in (0, 3600] seconds\n")
        return 2
    what = f"rank {args.rank}" if args.node is None else f"node {args.node}"
    server = args.server or f"127.0.0.1:{DEFAULT_PORT}"
    try:
        token, credentials = read_credentials(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)
        target = normalize_address(server)
    except ValueError as exc:
        sys.stderr.write(f"taskd migrate: {exc}\n")
        return 2
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    channel = grpc.secure_channel(target, credentials) if credentials is not None else grpc.insecure_channel(target)
    try:
        with channel:
            reply = taskd_pb2_grpc.JobControlStub(channel).Migrate(
                taskd_pb2.MigrateRequest(jobId=args.job, rank=args.rank or 0, timeout=args.timeout, node=args.node),
                timeout=args.timeout + 10.0, metadata=metadata)
    except grpc.RpcError as exc:
        sys.stderr.write(f"taskd migrate: the controller at {target} did not migrate {what}: "
                         f"{exc.code().name}: {exc.details()}\n")
        return 1
    report = reply.report
    if reply.status.code != 0:
        sys.stderr.write(f"taskd migrate: {what} of job {args.job} not migrated ({reply.status.code}): "
                         f"{reply.status.info}\n")
        return 1
    if args.node is not None:
        sys.stdout.write(f"migrated node {args.node} of job {args.job} (agent pid {report.oldPid} -> {report.newPid}) "
                         f"at step {report.step}: training paused {report.pauseSeconds:.3f}s (the longest of the "
                         "staying nodes' pauses)\n")
        return 0
    sys.stdout.write(f"migrated rank {report.rank} of job {args.job} (pid {report.oldPid} -> {report.newPid}) at "
                     f"step {report.step}: training paused {report.pauseSeconds:.3f}s\n")
    return 0
