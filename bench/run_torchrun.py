"""`python -m torch.distributed.run` with its log records also written as JSON lines to $BENCH_EVENTS.

Same flags and defaults as torchrun; LOGLEVEL=INFO is set so its agent logs when it acts on a failure.
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("LOGLEVEL", "INFO")

from jsonl_log import attach  # noqa: E402


def main() -> int:
    from torch.distributed import run

    attach("torch.distributed.elastic", level=logging.INFO)
    run.main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
