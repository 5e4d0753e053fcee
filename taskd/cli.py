"""`taskd` command line: parses flags into configs and hands them to the parts."""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("taskd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskd", description="Fault-tolerant supervision for distributed training")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        from importlib.metadata import version

        sys.stdout.write(version("taskd") + "\n")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
