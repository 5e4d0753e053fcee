"""A warm spare's side: waiting for the rank it becomes, and running the script (taskd.launcher.spares).

A spare is an interpreter the launcher starts before any rank needs replacing. In ``import`` mode it
imports the framework (TASKD_PREIMPORT) and waits on its stdin; in ``script`` mode
(``taskd run --warm-spare-mode script``) it also runs the script itself, with no rank, until the
script calls `become_rank` (`LiveGroup()` does): whatever the script does before that (parsing its
arguments, building the model, loading a dataset) is done before the fault, not after it. Both wait for
the same message, one JSON line on stdin: ``{"argv": [...], "env": {...}, "cwd": ...}``, the rank's
command line, environment and directory.

Standard library only: it runs in every spare, before the script's own imports.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import BinaryIO

from taskd.worker.env import Var, in_spare

NOT_A_RANK_EXIT = 3
"""A script-mode spare's exit code when the script ended without calling `become_rank` (it never can be one)."""


def become_rank() -> None:
    """Wait here, in a script-mode warm spare, until the launcher hands this process a rank; elsewhere a no-op.

    Afterwards the process's environment, ``sys.argv`` and directory are the rank's, as if it had been
    started as that rank. Everything the script did before must hold for any rank: nothing read from
    RANK and the like (`taskd.worker.rank()` and its kin raise until then), no file named after a rank,
    no device chosen. A launcher that closes without handing one a rank ends the process here (exit 0).
    """
    if not in_spare():
        return
    _take_rank(sys.stdin.buffer)


def _take_rank(stream: BinaryIO) -> None:
    line = stream.readline()
    if not line:  # the pool was closed (or this spare discarded) before it became a rank
        sys.stdout.flush()
        os._exit(0)  # not sys.exit: the script's atexit handlers and finally blocks are no rank's business
    message = json.loads(line)
    fd = os.open(os.devnull, os.O_RDONLY)  # a rank's stdin is /dev/null, as a freshly spawned one's
    os.dup2(fd, 0)
    os.close(fd)
    os.environ.clear()
    os.environ.update(message["env"])
    sys.argv = list(message["argv"])
    if message.get("cwd"):
        os.chdir(message["cwd"])


def run_spare() -> None:
    """A spare's main (`taskd.launcher.spares.SPARE_CODE`): import ahead, then run the script as ``python -u`` would."""
    if os.environ.get(Var.TASKD_PREIMPORT):  # e.g. torch: the replacement then joins in ms, not after a 1.5 s import
        from taskd.worker.live import preimport

        preimport()
    if in_spare():  # script mode: the script's own argv (the same for every rank), the rank comes at become_rank()
        sys.argv = json.loads(os.environ.pop(Var.TASKD_SPARE_ARGV))
    else:
        _take_rank(sys.stdin.buffer)
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
    if in_spare():
        sys.stderr.write(f"taskd: {sys.argv[0]} ended in a warm spare before it called LiveGroup() or "
                         "taskd.worker.become_rank(): --warm-spare-mode script needs one of them\n")
        sys.exit(NOT_A_RANK_EXIT)


__all__ = ["NOT_A_RANK_EXIT", "become_rank", "in_spare", "run_spare"]
