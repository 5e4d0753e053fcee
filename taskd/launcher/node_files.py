"""Where one node's files are: its ranks' logs (named by global rank), its old error files, its live store.

Apart from the launcher's process mechanics because a standby opens them twice: once as built, and
again for the node rank the controller assigns it (LocalLauncher.set_node_rank).
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from taskd.launcher.output import RankLog
from taskd.launcher.spares import python_script
from taskd.launcher.spec import WorkerSpec
from taskd.rendezvous import AgentStore, StoreHostError, wrapped_python
from taskd.worker.heartbeat_file import HeartbeatFile

log = logging.getLogger("taskd.launcher.local")


def open_node_files(spec: WorkerSpec) -> tuple[dict[int, RankLog], AgentStore]:
    """The node's rank logs, then its live-recovery setup; nothing left open if either is refused.

    Logs first: a refused log file (a planted symlink) stops the launch before anything starts; then
    node 0 binds the store's port, so a port in use stops it too. A standby (no node rank yet) has no logs and
    hosts no store, but knows whether its ranks will be live: its warm spares then pre-import the framework
    while it waits (they were plain interpreters before, and the standby's ranks imported torch after the loss).
    """
    if spec.node_rank is None:
        return {}, AgentStore.decide(spec.rdzv_store, entry_source(spec.entrypoint, spec.cwd), -1,
                                     spec.master_addr, spec.master_port, spec.run_dir or "", cwd=spec.cwd)
    logs: dict[int, RankLog] = {}
    try:
        for r in range(spec.nproc_per_node):
            logs[r] = RankLog(rank_log_path(spec.log_dir, spec, r))
        live = AgentStore.decide(spec.rdzv_store, entry_source(spec.entrypoint, spec.cwd), spec.node_rank,
                                 spec.master_addr, spec.master_port, spec.run_dir or "", cwd=spec.cwd)
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


def fresh_rank_files(heartbeat: str, error_file: str) -> None:
    """Before an incarnation starts: a zeroed heartbeat file, and no error file a predecessor left (what is found
    there after the rank dies is then this incarnation's)."""
    HeartbeatFile(heartbeat).create()
    remove_old(error_file)


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40] or "job"


__all__ = ["fresh_rank_files", "open_node_files", "rank_log_path", "remove_old", "safe_name", "set_node_count"]


def set_node_count(self: Any, count: int) -> None:
    """`LocalLauncher.set_node_count`: the nodes a `--nnodes MIN:MAX` job runs on now (nodes 0..count-1, the
    controller's `start_smaller`; all of them again once the others joined). The ranks started next get WORLD_SIZE
    and GROUP_WORLD_SIZE for `count` nodes; their global ranks do not change, so this node is one of them."""
    node = self.spec.node_rank
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or (node is not None and node >= count):
        raise ValueError(f"set_node_count takes a node count >= 1 that includes node {node}, got {count!r}")
    with self._lock:
        self._check_open()
        if count != self.spec.nnodes:
            self.spec = dataclasses.replace(self.spec, nnodes=count)


def entry_source(entrypoint: Sequence[str], cwd: str | None = None) -> str | None:
    """The file the ranks run first: a `.py` script, the source of `-m MODULE` (issue 21, D4: `-m` lost live
    recovery because only scripts were read), or what a `--no-python` command's Python runs (issue 32, F3:
    `numactl ... python -u train.py` lost it). Found as the ranks' `python -m` would find it, `cwd` first, without
    importing anything (a package's `__init__.py` is never run here); None when it cannot be found."""
    script = python_script(entrypoint)
    if script is not None:
        return script
    if len(entrypoint) >= 4 and entrypoint[0] == sys.executable and tuple(entrypoint[1:3]) == ("-u", "-m"):
        return module_source(entrypoint[3], cwd)
    wrapped = wrapped_python(entrypoint)
    if wrapped is None:
        return None
    kind, name = wrapped
    if kind == "module":
        return module_source(name, cwd)
    path = name if os.path.isabs(name) else os.path.join(cwd or os.getcwd(), name)
    return path if os.path.isfile(path) else None


def module_source(name: str, cwd: str | None = None) -> str | None:
    """The source `python -m name` runs, found from `cwd` first then this interpreter's path; None if not found."""
    path = [cwd or os.getcwd(), *sys.path[1:]]
    found = None
    for part in name.split("."):
        found = importlib.machinery.PathFinder.find_spec(part, path) if path else None
        if found is None:
            return None
        path = list(found.submodule_search_locations or [])
    if found is None:
        return None
    if found.submodule_search_locations:  # `-m package` runs its __main__
        main = importlib.machinery.PathFinder.find_spec("__main__", list(found.submodule_search_locations))
        return main.origin if main is not None and main.origin else None
    return found.origin if found.origin and found.origin.endswith(".py") else None
