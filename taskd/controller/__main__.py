"""`python -m taskd.controller [--listen HOST:PORT] [--state PATH] ...`: the same as `taskd server`."""

from __future__ import annotations

import argparse
import sys

from taskd.controller.cli_commands import add_server_arguments, server_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taskd.controller", description="taskd recovery controller")
    add_server_arguments(parser)
    return server_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
