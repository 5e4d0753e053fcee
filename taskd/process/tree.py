"""Which process under a launcher is which rank, as an outsider (an operator, a harness) sees it.

Every launcher taskd drives (its own, torchrun, msrun) gives a rank its RANK variable, so the
environment is the one label that holds whoever started the tree.
"""

from __future__ import annotations

import psutil


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{global rank: pid} of the live Python rank processes anywhere under ``launcher_pid``; {} once it is gone."""
    found: dict[int, int] = {}
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            env = child.environ()
            if "RANK" in env and child.status() != psutil.STATUS_ZOMBIE and "python" in child.name():
                found[int(env["RANK"])] = child.pid
        except (psutil.Error, ValueError):
            continue  # gone meanwhile, not ours to read, or a RANK that is not a number
    return found
