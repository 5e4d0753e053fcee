"""The drain hook: SIGUSR1 to `taskd run` asks the controller to move this node's ranks to a standby agent, as
`taskd migrate --job J --node N` does (taskd.v1 `JobControl/Migrate` with `node`, the agent's own credential).

Meant for a node about to go away: a Kubernetes preStop hook (`kill -USR1 1` where `taskd run` is the container's
first process), a Slurm node set to DRAIN (a script that signals the node's `taskd run`). The signal handler only
marks the request; the supervisor's loop asks (`poll`) on a thread of its own, since the call waits for the
migration's end, and the loop must go on (its ranks leave; this agent then ends with exit 0). A refusal (no
standby, node 0, no controller) is logged with its reason and the node runs on as it was.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import grpc

from taskd.client.rpc import make_channel

log = logging.getLogger("taskd.agent")

DRAIN_SIGNAL = signal.SIGUSR1
DRAIN_TIMEOUT = 300.0  # the migration's own stages are bounded well within this


class Drain:
    """This node's drain request, from SIGUSR1 to the controller's answer."""

    def __init__(self, link: Any) -> None:
        self.link = link  # the ControllerLink: its client's address, credential and job
        self.requested = False
        self._thread: threading.Thread | None = None

    def signalled(self, signum: int) -> bool:
        """Whether ``signum`` is the drain signal (then noted, from the signal handler: no I/O here)."""
        if signum != DRAIN_SIGNAL:
            return False
        self.requested = True
        return True

    def poll(self, node_rank: int | None) -> None:
        """Ask once a drain was signalled, for node ``node_rank`` (None: no node yet, e.g. a standby: ignored)."""
        if not self.requested or self._thread is not None:
            return
        self.requested = False
        mgr = self.link.client
        if node_rank is None or mgr is None:
            log.warning("drain (SIGUSR1) ignored: %s", "this agent holds no node" if node_rank is None else
                        "no controller to ask (a drain needs `taskd run --server`)")
            return
        log.info("drain (SIGUSR1): asking the controller to move node %d's ranks to a standby", node_rank)
        self._thread = threading.Thread(target=self._ask, args=(mgr, node_rank), name="taskd-drain", daemon=True)
        self._thread.start()

    def _ask(self, mgr: Any, node_rank: int) -> None:
        from taskd.proto import taskd_pb2, taskd_pb2_grpc

        try:
            with make_channel(mgr.server_addr, (), mgr.credentials) as channel:
                reply = taskd_pb2_grpc.JobControlStub(channel).Migrate(
                    taskd_pb2.MigrateRequest(jobId=mgr.info.jobId, node=node_rank, timeout=DRAIN_TIMEOUT),
                    metadata=mgr.credentials.metadata(), timeout=DRAIN_TIMEOUT + 10)
        except grpc.RpcError as exc:
            log.warning("drain of node %d not done: the controller answered %s: %s; the node runs on as it was",
                        node_rank, exc.code().name, exc.details())
        else:
            if reply.status.code != 0:
                log.warning("drain of node %d not done: %s; the node runs on as it was", node_rank, reply.status.info)
            else:
                log.info("drain of node %d done: its ranks run on a standby now (paused %.3fs)", node_rank,
                         reply.report.pauseSeconds)
        finally:
            self._thread = None


__all__ = ["DRAIN_SIGNAL", "Drain"]
