"""TaskD's import path of `MSRunPlugin`, with taskd's embedded controller bound in.

The plugin itself is `taskd.agent.plugin.MSRunPlugin`; this shim is a composition root: when no
MINDX_SERVER_IP is set, `MSRunPlugin()` (as msrun builds it) runs an embedded controller, and the
job's snapshot directory (`taskd.launcher.snapshots`) is made here, as `taskd run` makes it: msrun's
ranks inherit msrun's environment, so TASKD_SNAPSHOT_DIR set here reaches every rank it spawns. The persisted
copies (`taskd run --snapshot-persist-*`) are set by their variables, msrun's command line not being taskd's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import taskd.client  # noqa: F401 (first: its import switches gRPC fork support off before grpc loads)
from taskd.agent.config import AgentConfig
from taskd.agent.plugin import CALLBACKS, ControllerFactory
from taskd.agent.plugin import MSRunPlugin as AgentPlugin
from taskd.agent.ranks.control import LauncherDetails
from taskd.agent.summary import JobResult
from taskd.launcher.node_files import safe_name
from taskd.launcher.snapshots import SHM, Persistence, SnapshotArea


def embedded_controller(config: AgentConfig) -> Any:
    """A controller on a free loopback port, in memory, with a per-run token, living as long as the agent."""
    from taskd.controller.service.server import EmbeddedController

    return EmbeddedController.for_agent(config.max_restarts)


class MSRunPlugin(AgentPlugin):
    """taskd.agent.plugin.MSRunPlugin with `embedded_controller` as its default controller factory."""

    def __init__(self, details: LauncherDetails | None = None,
                 controller_factory: ControllerFactory | None = embedded_controller, **settings: Any) -> None:
        super().__init__(details, controller_factory, **settings)

    def run(self) -> JobResult:
        """The job, with its snapshot directory in msrun's environment while it runs, removed when it ends
        (every rank is gone then), and persisted with TASKD_SNAPSHOT_PERSIST_DIR (..._EVERY, ..._KEEP) set; a bad
        TASKD_SNAPSHOT_MEMORY or TASKD_SNAPSHOT_PERSIST_* fails the job with exit 2 naming it."""
        area = None
        if self.config is not None:
            try:
                area = msrun_area(self.config.job_id or str(os.getpid()), sys.argv, os.environ)
            except ValueError as exc:
                self.config, self.config_error = None, str(exc)
        added = area.env() if area is not None else {}
        os.environ.update(added)
        try:
            return super().run()
        finally:
            for name in added:
                os.environ.pop(name, None)
            if area is not None:
                area.close()


def _count(argv: list[str], flag: str) -> int | None:
    """The positive integer msrun's ``flag`` has in its own argv (``--flag N`` or ``--flag=N``), else None."""
    for i, arg in enumerate(argv):
        raw = argv[i + 1] if arg == flag and i + 1 < len(argv) else arg.partition("=")[2] \
            if arg.startswith(flag + "=") else ""
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return None


def local_workers(argv: list[str]) -> int:
    """msrun's --local_worker_num (else --worker_num) in its own argv: the ranks that share the node's cap."""
    return _count(argv, "--local_worker_num") or _count(argv, "--worker_num") or 1


def msrun_area(job: str, argv: list[str], environ: Mapping[str, str], root: str = SHM) -> SnapshotArea:
    """The job's snapshot area on this msrun node. As one node's, whatever msrun's node count: msrun's agent copies
    nothing to a buddy node (replication is `taskd run`'s), so no part of the cap is kept for a peer's copies and no
    push pins a rank's segment; only the persister (TASKD_SNAPSHOT_PERSIST_DIR) may."""
    return SnapshotArea(safe_name(f"msrun-{job}"), local_workers(argv), environ, root=root,
                        persist=Persistence.from_env(environ))


__all__ = ["CALLBACKS", "MSRunPlugin", "embedded_controller", "local_workers", "msrun_area"]
