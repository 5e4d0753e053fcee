"""`taskd` command line: parses flags and hands them to the parts (run, server, status)."""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("taskd")


class _CommandParser(argparse.ArgumentParser):
    """A command's own parser: a flag it does not know is its error, shown with its usage (not `taskd`'s)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    from taskd.controller.cli_commands import (
        add_migrate_arguments,
        add_server_arguments,
        add_status_arguments,
        add_token_arguments,
    )
    from taskd.run import add_run_arguments

    parser = argparse.ArgumentParser(prog="taskd", description="Fault-tolerant supervision for distributed training")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    add_run_arguments(sub.add_parser("run", help="launch and supervise a training job (torchrun-like)"))
    add_server_arguments(sub.add_parser("server", help="run the recovery controller"))
    add_status_arguments(sub.add_parser("status", help="show jobs, faults and recoveries of a controller"))
    add_token_arguments(sub.add_parser("token", help="mint a job's credential from the controller's token file"))
    add_migrate_arguments(sub.add_parser("migrate", help="move a rank of a live job to a warm spare, training on"))
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "server":  # the controller logs its own events at --log-level
        from taskd.controller.cli_commands import server_main

        if args.verbose:
            args.log_level = "DEBUG"
        return server_main(args)
    from taskd.run import setup_console_logging

    setup_console_logging(args.verbose)
    if args.command == "run":
        from taskd.run import run_main
        from taskd.run_config import build_or_exit

        return run_main(build_or_exit(args))
    if args.command == "status":
        from taskd.controller.cli_commands import status_main

        return status_main(args)
    if args.command == "migrate":
        from taskd.controller.cli_commands import migrate_main

        return migrate_main(args)
    if args.command == "token":
        from taskd.controller.cli_commands import token_main

        return token_main(args)
    from importlib.metadata import version

    sys.stdout.write(version("taskd") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
