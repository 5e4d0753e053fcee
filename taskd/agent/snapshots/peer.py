"""What passes between two agents of a job for its snapshots: the buddy's service and the calls made to it.

`PeerService` is what a buddy serves (taskd.v1 `SnapshotPeer`): copies pushed to it, kept under
``<dir>/peer/node<N>/``, counted against their share of the job's snapshot memory on its node (a push past it is
refused, `FULL`), and fetched back by a lost node's replacement. `push_segments` and `fetch_segments` are the
calls a node makes (agent/snapshots/replication.py's threads, a replacement's restore). Every call carries
``authorization: Bearer <key>``, the job's credential: a peer presenting another job's is refused.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import BinaryIO

import grpc

from taskd.agent.snapshots import copies as sc
from taskd.proto import recover_pb2, taskd_pb2, taskd_pb2_grpc
from taskd.worker.snapshot_segment import SnapshotError, read_header

log = logging.getLogger("taskd.agent")

_AUTH = "authorization"
FULL = 507
"""A push's status when the copies it adds would take this node's past their share of the job's snapshot memory."""


class CopyRefused(Exception):
    """A push that would take the copies held here past their share of the cap: received no further."""

    def __init__(self, node: int, why: str) -> None:
        super().__init__(why)
        self.node = node


class PeerService(taskd_pb2_grpc.SnapshotPeerServicer):
    """What a buddy serves: copies pushed to it (kept under ``<dir>/peer/node<N>/``), fetched back by a replacement."""

    def __init__(self, directory: str, job_id: Callable[[], str], key: Callable[[], str | None], cap: int = 0
                 ) -> None:
        """``cap``: bytes the copies held here may take, those being received included (0: no bound)."""
        self.directory, self.job_id, self.key, self.cap = directory, job_id, key, cap
        self._receiving = 0  # bytes of the pushes in flight, not yet published (counted as they arrive)
        self._held: int | None = None  # bytes the published copies hold (`_held_bytes`); None: walk them again
        self.ward: tuple[int, int] = (-1, -1)  # (node, newest step) of the copy pushed here last
        self.wards: dict[int, int] = {}  # every node whose copy is held here -> the newest step of its copy
        self._refused: set[int] = set()  # nodes whose last push was refused (FULL): said once, until one lands
        self._lock = threading.Lock()  # a push's publish, a ward's removal, a fetch's pins: one at a time

    def _refusal(self, context: grpc.ServicerContext, job_id: str) -> None:
        key = self.key()
        sent = dict(context.invocation_metadata()).get(_AUTH, "")
        if key is None or not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "not this job's snapshot key (another job's credential?)")
        if job_id != self.job_id():
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this agent serves job {self.job_id()!r}, not {job_id!r}")

    def _root(self, node: int) -> str:
        return os.path.join(self.directory, "peer", f"node{node}")

    def Push(self, request_iterator: Iterator[taskd_pb2.SnapshotChunk], context: grpc.ServicerContext
             ) -> recover_pb2.Status:
        """Receive a push whole, then publish it whole: every segment is checked as it arrives, and only when all
        passed are they renamed to their steps' names, together (under the lock a fetch pins under), so that the
        copy never holds one rank's newer step without the others' (a torn segment of one rank, pushed again and
        again, would otherwise prune the step the node's ranks have in common)."""
        taken = [0]  # bytes this push added to `_receiving`: given back once they are published, or gone
        try:
            node, received = self._receive(request_iterator, context, taken)
        except CopyRefused as exc:
            self._give_back(taken)
            self._refuse(exc.node, str(exc))
            return recover_pb2.Status(code=FULL, info=str(exc))
        except (SnapshotError, OSError) as exc:
            self._give_back(taken)
            return recover_pb2.Status(code=409, info=str(exc))
        except BaseException:
            self._give_back(taken)
            raise
        with self._lock:  # an old ward's copy stays (its node may be lost, its replacement yet to fetch it)
            try:
                for incoming in received:
                    incoming.publish()
            finally:
                self._receiving -= taken[0]  # counted by `held_bytes` now, under their steps' names
                self._held = None  # published, older steps pruned
            if received:
                self.ward = (node, min(incoming.step for incoming in received))
                self.wards[node] = self.ward[1]
                self._refused.discard(node)
        return recover_pb2.Status(code=0, info=f"{len(received)} segment(s)")

    def _give_back(self, taken: list[int]) -> None:
        with self._lock:
            self._receiving -= taken[0]

    def _take(self, node: int, size: int, taken: list[int]) -> None:
        """Count ``size`` more bytes of ``node``'s push, or CopyRefused when the copies held here, those received
        meanwhile included, would then pass the cap: the node's total for the job stays within it."""
        if not self.cap:
            return
        with self._lock:
            total = self._held_bytes() + self._receiving + size
            if total > self.cap:
                raise CopyRefused(node, f"node {node}'s snapshots would take the copies this node holds to "
                                        f"{total / 1e6:.1f} MB, above their share of the job's snapshot memory, "
                                        f"{self.cap / 1e6:.1f} MB (--snapshot-memory / TASKD_SNAPSHOT_MEMORY)")
            self._receiving += size
        taken[0] += size

    def _held_bytes(self) -> int:
        """What the published copies hold (under the lock): walked once after each change this service makes to
        them (a publish and its pruning, a drop, a fetch's pins removed), not for every chunk of a push."""
        if self._held is None:
            self._held = sc.held_bytes(os.path.join(self.directory, "peer"))
        return self._held

    def _refuse(self, node: int, why: str) -> None:
        """Drop ``node``'s copy too (older than its ranks' kept steps from now on, it could only mislead a restore
        and hold memory): a restore of that node falls back as when no copy exists."""
        self.drop([node])
        with self._lock:
            sc.remove(self._root(node))  # the folders its first push made, had it no copy here yet
            self._held = None
            again = node in self._refused
            self._refused.add(node)
        log.log(logging.DEBUG if again else logging.WARNING, "%s: refused; node %d's copy is dropped and its "
                "snapshots are not replicated here (a lost node %d restores from disk)", why, node, node)

    def drop(self, nodes: Iterable[int]) -> None:
        """Remove the copies of ``nodes`` (the controller's word: each is live again and copied elsewhere)."""
        with self._lock:
            for node in nodes:
                if self.wards.pop(node, None) is not None:
                    sc.remove(self._root(node))
                    self._held = None
                    log.debug("node %d's snapshot copy dropped: that node is copied to another agent now", node)
                if self.ward[0] == node:
                    self.ward = (-1, -1)

    def _receive(self, request_iterator: Iterator[taskd_pb2.SnapshotChunk], context: grpc.ServicerContext,
                 taken: list[int]) -> tuple[int, list[sc.Incoming]]:
        """The pushing node and its segments, each verified, none published; on any error none is left behind."""
        received: list[sc.Incoming] = []
        incoming: sc.Incoming | None = None
        node = -1
        try:
            for chunk in request_iterator:
                if incoming is None:
                    if node < 0:
                        self._refusal(context, chunk.jobId)
                        node = chunk.nodeRank
                    incoming = sc.Incoming(self._root(node), chunk.rank, chunk.step)
                self._take(node, len(chunk.data), taken)
                incoming.write(chunk.data)
                if chunk.last:
                    incoming, done = None, incoming
                    done.verify()
                    received.append(done)
        except BaseException:
            for left in ([incoming] if incoming is not None else []) + received:
                left.abandon()
            raise
        return node, received

    def Fetch(self, request: taskd_pb2.FetchRequest, context: grpc.ServicerContext
              ) -> Iterator[taskd_pb2.SnapshotChunk]:
        """Node ``request.nodeRank``'s copy as it is now: every segment pinned (hard links, under the lock a push
        publishes under) before the first is sent, so that a push meanwhile, which replaces and prunes names,
        changes nothing of what this fetch sends."""
        self._refusal(context, request.jobId)
        pins = os.path.join(self.directory, "peer", f".fetch-{os.urandom(4).hex()}")
        try:
            with self._lock:
                pinned = sc.pin(self._root(request.nodeRank), pins)
            for rank, step, path in pinned:
                yield from _chunks(request.jobId, request.nodeRank, rank, step, open(path, "rb"))  # noqa: SIM115
        finally:
            sc.remove(pins)
            with self._lock:  # a copy pruned while pinned is freed only now
                self._held = None


def _chunks(job_id: str, node: int, rank: int, step: int, fh: BinaryIO) -> Iterator[taskd_pb2.SnapshotChunk]:
    """The open segment ``fh`` as chunks, its header and body only (not the padding of its reuse), the last one
    marked; read as they are sent, so one chunk is in memory. SnapshotError when it holds no finished segment."""
    with fh:
        head = fh.read(sc.HEADER_SIZE)
        left = sc.HEADER_SIZE + read_header(head, fh.name).length
        part, left = head, left - len(head)
        while True:
            after = fh.read(min(sc.CHUNK, left)) if left > 0 else b""
            left -= len(after)
            yield taskd_pb2.SnapshotChunk(jobId=job_id, nodeRank=node, rank=rank, step=step, data=part, last=not after)
            if not after:
                return
            part = after


def push_segments(address: str, key: str, job_id: str, node: int, step: int | Mapping[int, int],
                  files: list[tuple[int, BinaryIO]], timeout: float) -> recover_pb2.Status:
    """Send node ``node``'s open segments (local rank, file) of ``step`` (every rank's, or a step per rank) to the peer
    agent at ``address`` with the job's key, read as they are sent; the files are closed. grpc.RpcError or
    SnapshotError when it fails."""
    steps = step if isinstance(step, Mapping) else {rank: step for rank, _fh in files}
    chunks = (c for rank, fh in files for c in _chunks(job_id, node, rank, steps[rank], fh))
    try:
        with grpc.insecure_channel(address) as channel:
            return taskd_pb2_grpc.SnapshotPeerStub(channel).Push(chunks, timeout=timeout,
                                                                 metadata=((_AUTH, f"Bearer {key}"),))
    finally:
        for _rank, fh in files:
            fh.close()


def fetch_segments(address: str, key: str, job_id: str, node: int, into: str,
                   timeout: float) -> list[tuple[int, int, int]]:
    """Fetch node ``node``'s copy from the peer agent at ``address`` into the snapshot directory ``into`` (each
    segment published as it completes, a torn one abandoned): (rank, step, bytes) of each segment received."""
    got: list[tuple[int, int, int]] = []
    incoming: sc.Incoming | None = None
    size = 0
    with grpc.insecure_channel(address) as channel:
        stream = taskd_pb2_grpc.SnapshotPeerStub(channel).Fetch(
            taskd_pb2.FetchRequest(jobId=job_id, nodeRank=node), timeout=timeout, metadata=((_AUTH, f"Bearer {key}"),))
        try:
            for chunk in stream:
                if incoming is None:
                    incoming, size = sc.Incoming(into, chunk.rank, chunk.step), 0
                incoming.write(chunk.data)
                size += len(chunk.data)
                if chunk.last:
                    incoming.finish(keep=None)
                    got.append((chunk.rank, chunk.step, size))
                    incoming = None
        finally:
            if incoming is not None:
                incoming.abandon()
    return got


__all__ = ["FULL", "CopyRefused", "PeerService", "fetch_segments", "push_segments"]
