"""Where one node's files are: its ranks' logs (named by global rank), its old error files, its live store.

Apart from the launcher's process mechanics because a standby opens them twice: once as built, and
again for the node rank the controller assigns it (LocalLauncher.set_node_rank).
"""

from __future__ import annotations

import logging
import os

from taskd.launcher.output import RankLog
from taskd.launcher.spares import python_script
from taskd.launcher.spec import WorkerSpec
from taskd.rendezvous import AgentStore, StoreHostError

log = logging.getLogger("taskd.launcher.local")


def open_node_files(spec: WorkerSpec) -> tuple[dict[int, RankLog], AgentStore]:
    """The node's rank logs, then its live-recovery setup; nothing left open if either is refused.

    Logs first: a refused log file (a planted symlink) stops the launch before anything starts; then
    node 0 binds the store's port, so a port in use stops it too.
    """
    logs: dict[int, RankLog] = {}
    try:
        for r in range(spec.nproc_per_node):
            logs[r] = RankLog(rank_log_path(spec.log_dir, spec, r))
        live = AgentStore.decide(spec.rdzv_store, python_script(spec.entrypoint), spec.node_rank, spec.master_addr,
                                 spec.master_port, spec.run_dir or "")
    except (OSError, StoreHostError, ValueError):
        for rank_log in logs.values():
            rank_log.close()
        raise
    return logs, live


def rank_log_path(log_dir: str | None, spec: WorkerSpec, local_rank: int) -> str | None:
    return os.path.join(log_dir, f"rank_{spec.global_rank(local_rank)}.log") if log_dir else None


def remove_old(path: str) -> None:
    """Remove a previous incarnation's file (its error file), so that what is found later is the new one's."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove the old error file %s: %s", path, exc)


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40] or "job"


__all__ = ["open_node_files", "rank_log_path", "remove_old", "safe_name"]
