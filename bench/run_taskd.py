"""`taskd run` with its agent's log records also written as JSON lines to $BENCH_EVENTS.

Same flags as `taskd run`; only the extra log handler differs.
"""

from __future__ import annotations

import argparse
import sys

from jsonl_log import attach

from taskd.run import add_run_arguments, run_main, setup_console_logging
from taskd.run_config import build_or_exit


def main() -> int:
    parser = argparse.ArgumentParser(prog="run_taskd")
    add_run_arguments(parser)
    args = parser.parse_args()
    setup_console_logging()
    attach("taskd")
    return run_main(build_or_exit(args))


if __name__ == "__main__":
    sys.exit(main())
