"""A node's snapshots copied to its buddy's agent, and a lost node's copy fetched back (issue 33, item 3).

Each agent of a multi-node job serves taskd.v1 `SnapshotPeer` (agent/snapshots/peer.py) on the address that reaches
its controller (port 0) and runs two threads. Every `TICK` one looks for the newest step every local rank published
(else, ranks that drifted apart with no step in common, each rank's newest: `copies.to_push`) and pushes those
segments, as files, to its buddy's agent; every `REPORT` the other tells the controller what it holds
(`ReportSnapshots`) and learns its buddy, the holder of its own node's copy and the job's peer key
(controller/nodes/replicas.py). Neither touches a rank: a training step never waits for them. The report's lag
(`CopyLag`) says how far the buddy's copy is behind, in seconds (`taskd status`, the controller's metrics).

A replacement or a standby taking a lost node calls `restore_node` before its ranks start: it fetches the node's
copy from its holder into the node's own snapshot directory, where the ranks' `Snapshots.restore` finds it as
their own. With no copy anywhere it says so, and the ranks fall back to their disk checkpoints.

A buddy's copies count against the job's snapshot memory on its node (`--snapshot-memory`): the launcher keeps a
share of the cap for them (`SnapshotArea.wards`), and a push that would take the copies held here past it is refused
(`FULL`, the ward's copy dropped, both sides logging why): the pushing node keeps its local snapshots, a restore of
it falls back as when no copy exists, and it pushes to that buddy again only `REFUSED_RETRY` s later (the space
may have freed: a fetch's pins released, a lost ward's copy dropped), or at once to another buddy.

Every call between agents carries ``authorization: Bearer <key>``, the job's credential (a random key per job
when the controller has no token): a peer presenting another job's is refused, UNAUTHENTICATED.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import BinaryIO

import grpc

from taskd.agent.link.controller import ControllerLink
from taskd.agent.snapshots import copies as sc
from taskd.agent.snapshots.peer import FULL, PeerService, fetch_segments, push_segments
from taskd.proto import taskd_pb2, taskd_pb2_grpc
from taskd.worker.snapshot_account import Fetched, mark_fetched
from taskd.worker.snapshot_files import held
from taskd.worker.snapshot_segment import SnapshotError

log = logging.getLogger("taskd.agent")

TICK = 0.1  # seconds between two looks for a newer published step
REPORT = 1.0  # seconds between two reports to the controller
PUSH_TIMEOUT = 30.0
REFUSED_RETRY = 30.0  # seconds before a push to a buddy that refused one (FULL) is tried again
FETCH_TIMEOUT = 60.0


def _reach(target: str) -> str:
    """The local address that reaches ``target`` (host:port): the interface peers reach this agent on too."""
    host = target.rpartition(":")[0].strip("[]") or "127.0.0.1"
    try:
        family = socket.getaddrinfo(host, None)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _pinned(pins: str, paths: Mapping[int, str], stats: Mapping[int, os.stat_result]) -> list[tuple[int, BinaryIO]]:
    """Each rank's segment (``paths``, as ``stats`` saw it) linked under ``pins`` and opened there: (rank, file), for
    `push_segments`, which closes them. OSError, nothing left open, when one changed or went meanwhile (a newer
    step is there). The links keep the bytes until ``pins`` is removed, whatever the ranks do."""
    os.makedirs(pins, mode=0o700, exist_ok=True)
    files: list[tuple[int, BinaryIO]] = []
    try:
        for rank, path in sorted(paths.items()):
            link = os.path.join(pins, f"rank{rank}-{os.path.basename(path)}")
            os.link(path, link)
            fh = open(link, "rb")  # noqa: SIM115 - closed by push_segments, or below
            files.append((rank, fh))
            if os.fstat(fh.fileno()).st_ino != stats[rank].st_ino:
                raise FileNotFoundError(f"{path}: published again since it was looked at")
    except BaseException:
        for _rank, fh in files:
            fh.close()
        raise
    return files


def _fallback(why: str, directory: str, node: int, ranks: Sequence[int], lost: Mapping[int, int]) -> bool:
    """Say it, and tell each of the node's ranks (`snapshot_account`), so that its restore says why it falls back
    (and counts its steps redone from how far it got, ``lost``, as the node's previous agent last reported)."""
    log.warning("%s: its ranks fall back to their disk checkpoints", why)
    for rank in ranks:
        try:
            mark_fetched(directory, rank, Fetched(node, -1, (), why, lost.get(rank, -1)))
        except OSError as exc:
            log.debug("rank %d: the fallback's reason not recorded: %s", rank, exc)
    return False


@dataclass
class CopyLag:
    """How far, in seconds, the buddy's copy is behind what this node's ranks published (``lagSeconds``): while it
    holds their newest, the time from that copy's publish to its acknowledgement; while it lacks a newer one, the
    time since the first such step was published, so that it grows while replication stalls (pushes failing,
    refused or hung) instead of staying at the last copy's figure."""

    acked: float = 0.0  # the last acknowledged copy: seconds from its publish to the acknowledgement
    lacking_since: float | None = None  # the publish (wall clock) of the first step seen that the buddy lacks

    def lacks(self, published: float) -> None:
        if self.lacking_since is None:
            self.lacking_since = published

    def acknowledged(self, published: float, now: float) -> None:
        self.acked, self.lacking_since = max(0.0, now - published), None

    def seconds(self, now: float) -> float:
        return self.acked if self.lacking_since is None else max(self.acked, now - self.lacking_since)


class Replication:
    """This node's side: the peer service, the push and report threads, and the restore of a lost node's copy.

    Two threads, so that a push hung on a buddy that stopped answering (up to `PUSH_TIMEOUT`) never holds back the
    reports: the controller keeps hearing the node (a node silent for `replicas.STALE` is no one's buddy) and sees
    its lag grow. The push thread looks at the ranks' folders once a `TICK` (one listdir each); the report says what
    that look saw."""

    def __init__(self, directory: str, link: ControllerLink, cap: int = 0) -> None:
        """``cap``: bytes the copies this node receives as a buddy may take (`PeerService`; 0: no bound)."""
        self.directory, self.link = directory, link
        self.key: str | None = None
        self.buddy: tuple[int, str] = (-1, "")
        self.replicated = -1
        self.lag = CopyLag()
        self.service = PeerService(directory, lambda: self._job_id(), lambda: self.key, cap)
        self.refused_by: tuple[int, str] = (-1, "")  # the buddy that refused a push (FULL): tried again only
        self._refused_at = 0.0  # REFUSED_RETRY after this (monotonic), when it refused last
        self._server: grpc.Server | None = None
        self._address = ""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # buddy, replicated, lag, _pushed: set by both threads
        self._plan: dict[int, int] = {}  # what the last look at the ranks' folders would push
        self._newest: dict[int, int] = {}  # and each rank's own newest step there
        self._pushed: tuple[tuple[tuple[int, int], ...], tuple[int, ...]] = ((), ())  # ((rank, step)s, inodes) acked
        self._seen: dict[int, float] = {}  # inode -> publish time, of the segments of the plan last pushed

    def _job_id(self) -> str:
        mgr = self.link.client
        return mgr.info.jobId if mgr is not None else ""

    def start(self) -> None:
        """Serve and push, from now until `close` (a no-op without a controller: one node replicates to no one)."""
        _reply, target = self.link.report_snapshots(
            {"newestStep": -1, "replicatedStep": -1, "wardNodeRank": -1, "wardStep": -1}, timeout=2.0)
        if not target:
            return
        host = _reach(target)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="taskd-peer"))
        taskd_pb2_grpc.add_SnapshotPeerServicer_to_server(self.service, self._server)
        port = self._server.add_insecure_port(f"{host}:0" if ":" not in host else f"[{host}]:0")
        self._server.start()
        self._address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._threads = [threading.Thread(target=self._reporting, name="taskd-replication-report", daemon=True),
                         threading.Thread(target=self._pushing, name="taskd-replication", daemon=True)]
        for thread in self._threads:
            thread.start()
        log.debug("snapshot peer service on %s", self._address)

    def _report(self) -> taskd_pb2.SnapshotReply | None:
        ward, ward_step = self.service.ward
        with self._lock:
            said = {"address": self._address, "newestStep": min(self._plan.values(), default=-1),
                    "replicatedStep": self.replicated, "lagSeconds": self.lag.seconds(time.time()),
                    "wardNodeRank": ward, "wardStep": ward_step, "rankNewest": dict(self._newest),
                    "wards": dict(self.service.wards)}
        reply, _target = self.link.report_snapshots(said, timeout=2.0)
        if reply is None or reply.status.code != 0:
            return None
        self.key = reply.key or None
        if reply.dropWards:
            self.service.drop(reply.dropWards)
        buddy = (reply.buddyNodeRank, reply.buddyAddress)
        with self._lock:
            if buddy != self.buddy:
                if buddy[0] >= 0:
                    log.info("snapshots of this node are copied to node %d's agent (%s)", *buddy)
                self.buddy, self.replicated, self.lag, self._pushed = buddy, -1, CopyLag(), ((), ())  # holds nothing
                self.refused_by = (-1, "")
        return reply

    def _reporting(self) -> None:
        while True:
            self._report()
            if self._stop.wait(REPORT):
                return

    def _pushing(self) -> None:
        while not self._stop.wait(TICK):
            self.tick()

    def tick(self) -> None:
        """One look at the ranks' folders and, when the buddy lacks what they published, one push."""
        ranks = held(self.directory)
        plan = sc.plan(ranks)
        with self._lock:
            self._plan, self._newest, buddy = plan, {r: max(s) for r, s in ranks.items() if s}, self.buddy
            # its lag grows from the refusal on (`taskd status`): never acked
            refused = buddy == self.refused_by and time.monotonic() - self._refused_at < REFUSED_RETRY
        if buddy[0] >= 0 and not refused and self.key and plan:
            self._push(plan, buddy, self.key)

    def _push(self, plan: dict[int, int], buddy: tuple[int, str], key: str) -> None:
        """Push each local rank's segment of its step in ``plan`` to ``buddy``, pinned while it is read (`_pinned`:
        a rank never writes into a segment with a link besides its own, so a fast rank cannot tear the copy)."""
        paths = {r: os.path.join(self.directory, f"rank{r}", sc.segment_name(step)) for r, step in plan.items()}
        try:
            stats = {rank: os.stat(path) for rank, path in paths.items()}
        except OSError:  # a rank freed it meanwhile: a newer step is there
            return
        # the publish is the segment's rename: its ctime when first seen (a link, ours or the persister's, moves it)
        self._seen = {st.st_ino: self._seen.get(st.st_ino, st.st_ctime) for st in stats.values()}
        published = max(self._seen.values())
        done = (tuple(sorted(plan.items())), tuple(sorted(st.st_ino for st in stats.values())))
        with self._lock:
            current = buddy == self.buddy
            if current and done != self._pushed:
                self.lag.lacks(published)
        if not current or done == self._pushed:
            return
        node = self.link.client.info.nodeRank if self.link.client is not None else -1
        pins = os.path.join(self.directory, ".replicate")
        try:
            files = _pinned(pins, paths, stats)
            status = push_segments(buddy[1], key, self._job_id(), node, plan, files, PUSH_TIMEOUT)
        except (grpc.RpcError, SnapshotError, OSError) as exc:
            log.debug("snapshot push of steps %s to %s failed: %s", plan, buddy[1], exc)
            return
        finally:
            sc.remove(pins)
        steps = dict(sorted(plan.items()))
        if status.code == FULL:
            with self._lock:
                again, self.refused_by, self._refused_at = self.refused_by == buddy, buddy, time.monotonic()
            log.log(logging.DEBUG if again else logging.WARNING,
                    "node %d's agent refused this node's snapshots (steps %s): %s; this node's ranks keep their local "
                    "snapshots (a lost node here restores from disk); tried again every %.0fs", buddy[0], steps,
                    status.info, REFUSED_RETRY)
            return
        if status.code != 0:
            log.debug("node %d's agent refused steps %s: %s", buddy[0], plan, status.info)
            return
        with self._lock:
            if buddy == self.buddy:  # not a buddy given up meanwhile
                self.replicated, self._pushed = min(plan.values()), done
                self.lag.acknowledged(published, time.time())
            taken_again = self.refused_by == buddy
            if taken_again:
                self.refused_by = (-1, "")
        if taken_again:
            log.info("node %d's agent takes this node's snapshots again (steps %s)", buddy[0], steps)

    def restore_node(self, node: int, ranks: Sequence[int] = ()) -> bool:
        """Fetch node ``node``'s copy from its holder into this node's directory (a replacement, before its ranks
        start), and say on the console what its ranks restore from (``ranks``, the node's global ranks, are told why
        when nothing can be fetched): True when they restore from memory."""
        started = time.monotonic()
        reply = self._report()
        if reply is None or reply.holderNodeRank < 0:
            why = "no agent holds a copy of it" if reply is not None else "the controller did not answer"
            return _fallback(f"no buddy copy of node {node}'s snapshots survives ({why})", self.directory, node, ranks,
                             reply.lostNewest if reply is not None else {})
        try:
            got = fetch_segments(reply.holderAddress, self.key, self._job_id(), node, self.directory, FETCH_TIMEOUT)
        except (grpc.RpcError, SnapshotError, OSError) as exc:  # its holder lost too, not yet known to be
            said = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.Call) else str(exc)
            return _fallback(f"node {node}'s snapshots could not be fetched from node {reply.holderNodeRank}'s agent "
                             f"({said})", self.directory, node, ranks, reply.lostNewest)
        if not got:
            return _fallback(f"node {reply.holderNodeRank} holds no snapshot of node {node}", self.directory, node,
                             ranks, reply.lostNewest)
        size = sum(n for _r, _s, n in got)
        steps = sorted({s for _r, s, _n in got})
        for rank in sorted({r for r, _s, _n in got}):  # so that its restore says "buddy" (snapshot_account)
            mark_fetched(self.directory, rank, Fetched(node, reply.holderNodeRank,
                                                       tuple(sorted(s for r, s, _n in got if r == rank)),
                                                       newest=reply.lostNewest.get(rank, -1)))
        log.info("fetched node %d's snapshots (steps %s, %d segments, %.1f MB) from node %d's agent in %.2fs: its "
                 "ranks restore from memory", node, ", ".join(map(str, steps)), len(got), size / 1e6,
                 reply.holderNodeRank, time.monotonic() - started)
        return True

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:  # a push to a buddy that stopped answering is not waited for (a daemon thread)
            thread.join(timeout=2.0)
        if self._server is not None:
            self._server.stop(grace=None)


__all__ = ["CopyLag", "Replication"]
