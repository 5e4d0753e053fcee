"""The drain hook: SIGUSR1 to `taskd run`, or a file appearing (`--drain-file PATH`, TASKD_DRAIN_FILE), asks the
controller to move this node's ranks to a standby agent, as `taskd migrate --job J --node N` does (taskd.v1
`JobControl/Migrate` with `node`, the agent's own credential).

Meant for a node about to go away: a Kubernetes preStop hook (`kill -USR1 1` where `taskd run` is the container's
first process, or `touch PATH`), a Slurm node set to DRAIN (a script that signals the node's `taskd run` or touches
its file), a health checker's verdict. The signal handler only marks the request; the file is looked for from the
supervisor's loop (`poll`, one stat at most every `LOOK_EVERY` s: no thread, no inotify watch, since the loop wakes
that often anyway) and removed once seen, so each appearance is one request and a second drain needs a new touch;
a file already there when the agent starts is left from before it and removed unread. The loop then asks on a
thread of its own, since the call waits for the migration's end and the loop must go on (its ranks leave; this
agent then ends with exit 0). A refusal (no standby, node 0, no controller) is logged with its reason and the node
runs on as it was.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import grpc

from taskd.client.rpc import make_channel

log = logging.getLogger("taskd.agent")

DRAIN_SIGNAL = signal.SIGUSR1
DRAIN_TIMEOUT = 300.0  # the migration's own stages are bounded well within this
LOOK_EVERY = 0.5  # seconds between two looks for the drain file (the loop's own wake-ups bound it from below)


def check_drain_file(path: str) -> str:
    """Why `path` cannot be a drain file ("" when it can): its directory must exist (the agent creates none) and be
    writable (the file is removed once acted on), and the path must not be a directory."""
    if not path.strip():
        return "give a file's path (empty)"
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return f"{path} is a directory: give the path of a file in it, e.g. {os.path.join(path, 'drain')}"
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        return f"its directory {parent} does not exist (or is not a directory): create it first"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent} is not writable: the file is removed once acted on"
    return ""


class Drain:
    """This node's drain request, from SIGUSR1 or the drain file to the controller's answer."""

    def __init__(self, link: Any, file: str | None = None) -> None:
        self.link = link  # the ControllerLink: its client's address, credential and job
        self.requested = False
        self.file = file  # --drain-file (checked where the config is built); None: no file watched
        self._next_look = 0.0
        self._thread: threading.Thread | None = None
        if file is not None and self._take_file():
            log.warning("drain file %s was there before this agent started: removed, not acted on (touch it again "
                        "to drain this node)", file)

    def signalled(self, signum: int) -> bool:
        """Whether ``signum`` is the drain signal (then noted, from the signal handler: no I/O here)."""
        if signum != DRAIN_SIGNAL:
            return False
        self.requested = True
        return True

    def poll(self, node_rank: int | None, now: float) -> None:
        """Ask once a drain was signalled or its file appeared, for node ``node_rank`` (None: no node yet, e.g. a
        standby: ignored). ``now``: the loop's monotonic clock, which paces the looks for the file."""
        if self._thread is not None:  # one request at a time: a signal or a file meanwhile waits for its answer
            return
        how = "SIGUSR1" if self.requested else ""
        if not how and self.file is not None and now >= self._next_look:
            self._next_look = now + LOOK_EVERY
            how = f"file {self.file}" if self._take_file() else ""
        if not how:
            return
        self.requested = False
        mgr = self.link.client
        # a standby registers as one until it takes a node: one that yielded a node keeps that node's layout
        if node_rank is None or mgr is None or mgr.info.standby:
            log.warning("drain (%s) ignored: %s", how, "no controller to ask (a drain needs `taskd run --server`)"
                        if mgr is None and node_rank is not None else "this agent holds no node")
            return
        log.info("drain (%s): asking the controller to move node %d's ranks to a standby", how, node_rank)
        self._thread = threading.Thread(target=self._ask, args=(mgr, node_rank), name="taskd-drain", daemon=True)
        self._thread.start()

    def _take_file(self) -> bool:
        """Whether the drain file is there; it is removed (taken) when it is. One that cannot be removed is acted
        on once and no longer watched: it would ask again at every look."""
        assert self.file is not None
        try:
            os.unlink(self.file)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("drain file %s cannot be removed (%s): it is no longer watched", self.file, exc.strerror or exc)
            self.file = None
        return True

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


__all__ = ["DRAIN_SIGNAL", "Drain", "check_drain_file"]
