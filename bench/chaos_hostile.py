"""Hostile calls of bench/chaos.py: what a stranger or a broken client sends a controller while real jobs run.

Each call names what a correct controller answers. Forgeries (a fault or finish report for a real job,
a Register for a live agent's node) are sent without the token or with a wrong one; they only mean
something with a token configured (without one, such a call is a legitimate agent's). Malformed calls
(huge or outside rank ids, bad job ids, a huge node count, undecodable or oversized bytes) are sent
either way: with the token when there is one, so that they reach validation instead of stopping at
authentication, and some without it. A call is *accepted* when it is answered OK with Status code 0:
for every call here that is a hole.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from taskd.proto import recover_pb2, taskd_pb2
from taskd.vocabulary import Code

R, T = recover_pb2, taskd_pb2
CALL_TIMEOUT = 10.0
OVERSIZE = 5 * 2**20  # past the controller's 4 MB request limit


@dataclass(frozen=True)
class Target:
    """A live job to aim at: its id, shape and a node whose agent holds its signal stream."""

    job_id: str
    nodes: int
    ranks_per_node: int
    node: int
    host: str
    pid: int


@dataclass(frozen=True)
class Outcome:
    kind: str
    verdict: str  # refused (as expected) | refused-otherwise | accepted | unanswered
    got: str  # "grpc CODE" or "status N"


# kind -> (needs a target job, forgery: only meaningful with a token)
KINDS = {
    "forged_fault": (True, True), "forged_finish": (True, True), "forged_register": (True, True),
    "stolen_register": (True, False), "huge_rank": (True, False), "rank_outside": (True, False),
    "bad_job_id": (False, False), "huge_node_count": (False, False), "garbage": (False, False),
    "oversized": (False, False),
}


def _status_call(ch: grpc.Channel, path: str, data: bytes, metadata: list[tuple[str, str]]) -> tuple[str, int]:
    """("OK", Status code) or (gRPC code name, -1)."""
    try:
        reply = ch.unary_unary(path)(data, timeout=CALL_TIMEOUT, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code().name, -1
    return "OK", R.Status.FromString(reply).code


class Hostile:
    """One insecure channel to the controller; `send` makes one hostile call of a kind and judges the answer."""

    def __init__(self, address: str, token: str | None, rng: random.Random) -> None:
        self.address = address
        self.token = token
        self.rng = rng
        self._fresh = 0
        self.channel: grpc.Channel | None = None

    def open(self) -> None:
        """A new channel per burst: one left in reconnect backoff by a controller restart would answer UNAVAILABLE."""
        self.close()
        self.channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", -1)])

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def kinds(self, have_target: bool) -> list[str]:
        return [k for k, (needs, forgery) in KINDS.items()
                if (have_target or not needs) and (self.token is not None or not forgery)]

    def _insider(self) -> list[tuple[str, str]]:
        """The real token (a malformed call from a token holder reaches validation), or none without one."""
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def _stranger(self) -> list[tuple[str, str]]:
        return [] if self.rng.random() < 0.5 else [("authorization", "Bearer not-the-token-" + "x" * 20)]

    def send(self, kind: str, target: Target | None) -> Outcome:
        call = getattr(self, f"_{kind}")
        path, data, metadata, expected = call(target) if KINDS[kind][0] else call()
        if self.channel is None:
            self.open()
        assert self.channel is not None
        code, status = _status_call(self.channel, path, data, metadata)
        got = f"status {status}" if code == "OK" else f"grpc {code}"
        if code == "OK" and status == Code.OK:
            verdict = "accepted"
        elif code in ("UNKNOWN", "INTERNAL", "DEADLINE_EXCEEDED", "UNAVAILABLE"):
            verdict = "unanswered"
        elif got in expected:
            verdict = "refused"
        else:
            verdict = "refused-otherwise"
        return Outcome(kind, verdict, got)

    # ------------------------------------------------------------------ forgeries (need the token)

    def _forged_fault(self, t: Target) -> tuple:
        rank = t.node * t.ranks_per_node + self.rng.randrange(t.ranks_per_node)
        req = R.ProcessFaultRequest(jobId=t.job_id, nodeRank=t.node, detail="forged by bench/chaos.py",
                                    faultRanks=[R.FaultRank(rankId=str(rank), faultType="1")])
        return "/Recover/ReportProcessFault", req.SerializeToString(), self._stranger(), {"grpc UNAUTHENTICATED"}

    def _forged_finish(self, t: Target) -> tuple:
        req = T.FinishRequest(jobId=t.job_id, nodeRank=t.node, exitCode=1, message="forged by bench/chaos.py")
        return "/taskd.v1.AgentReport/ReportFinished", req.SerializeToString(), self._stranger(), \
            {"grpc UNAUTHENTICATED"}

    def _forged_register(self, t: Target) -> tuple:
        info = R.ClientInfo(jobId=t.job_id, role="agent", nodeRank=t.node, nodeCount=t.nodes,
                            ranksPerNode=t.ranks_per_node, host="chaos-thief", pid=self.rng.randrange(2, 2**22))
        return "/Recover/Register", info.SerializeToString(), self._stranger(), {"grpc UNAUTHENTICATED"}

    # ------------------------------------------------------------------ malformed or out of bounds

    def _stolen_register(self, t: Target) -> tuple:
        """Another (host, pid) claims a node whose agent is live: 409, and the live agent keeps its stream."""
        info = R.ClientInfo(jobId=t.job_id, role="agent", nodeRank=t.node, nodeCount=t.nodes,
                            ranksPerNode=t.ranks_per_node, host="chaos-thief", pid=self.rng.randrange(2, 2**22))
        return "/Recover/Register", info.SerializeToString(), self._insider(), {f"status {Code.INVALID_PARAMS}"}

    def _huge_rank(self, t: Target) -> tuple:
        rank = self.rng.choice([str(2**63), str(2**31), "9" * 5000])
        req = R.ProcessFaultRequest(jobId=t.job_id, nodeRank=t.node, faultRanks=[R.FaultRank(rankId=rank,
                                                                                             faultType="1")])
        return "/Recover/ReportProcessFault", req.SerializeToString(), self._insider(), \
            {f"status {Code.INVALID_PARAMS}"}

    def _rank_outside(self, t: Target) -> tuple:
        """A rank the job does not have, or (2 nodes) another node's rank: 402, no round, no restart spent."""
        world = t.nodes * t.ranks_per_node
        if t.nodes > 1 and self.rng.random() < 0.5:
            other = (t.node + 1) % t.nodes
            rank = other * t.ranks_per_node
        else:
            rank = world + self.rng.randrange(1000)
        req = R.ProcessFaultRequest(jobId=t.job_id, nodeRank=t.node, faultRanks=[R.FaultRank(rankId=str(rank),
                                                                                             faultType="1")])
        return "/Recover/ReportProcessFault", req.SerializeToString(), self._insider(), \
            {f"status {Code.JOB_NOT_EXIST}"}

    def _bad_job_id(self) -> tuple:
        job = self.rng.choice(["chaos\x00evil", "chaos\u202eevil", "x" * 300, ""])
        if self.rng.random() < 0.5:
            info = R.ClientInfo(jobId=job, role="agent", nodeCount=1, ranksPerNode=1, host="chaos", pid=1)
            return "/Recover/Init", info.SerializeToString(), self._insider(), {f"status {Code.INVALID_PARAMS}"}
        req = R.ProcessFaultRequest(jobId=job, faultRanks=[R.FaultRank(rankId="0", faultType="1")])
        return "/Recover/ReportProcessFault", req.SerializeToString(), self._insider(), \
            {f"status {Code.INVALID_PARAMS}"}

    def _huge_node_count(self) -> tuple:
        self._fresh += 1
        info = R.ClientInfo(jobId=f"chaos-hostile-{self.rng.randrange(2**32):08x}-{self._fresh}", role="agent",
                            nodeCount=2**31 - 1, ranksPerNode=8, host="chaos", pid=1)
        return "/Recover/Init", info.SerializeToString(), self._insider(), {f"status {Code.INVALID_PARAMS}"}

    def _garbage(self) -> tuple:
        """Bytes that cannot decode: a length-delimited field 1 claiming 127 bytes, followed by fewer."""
        path = self.rng.choice(["/Recover/Init", "/Recover/Register", "/Recover/ReportProcessFault",
                                "/Recover/ReportStopComplete", "/taskd.v1.AgentReport/ReportFinished"])
        data = b"\x0a\x7f" + self.rng.randbytes(self.rng.randrange(0, 100))
        if self.token and self.rng.random() < 0.5:
            return path, data, self._stranger(), {"grpc UNAUTHENTICATED", "grpc INVALID_ARGUMENT"}
        return path, data, self._insider(), {"grpc INVALID_ARGUMENT"}

    def _oversized(self) -> tuple:
        req = R.ProcessFaultRequest(jobId="chaos-oversized", detail="x" * OVERSIZE,
                                    faultRanks=[R.FaultRank(rankId="0", faultType="1")])
        if self.token and self.rng.random() < 0.5:
            return "/Recover/ReportProcessFault", req.SerializeToString(), self._stranger(), \
                {"grpc RESOURCE_EXHAUSTED", "grpc UNAUTHENTICATED"}
        return "/Recover/ReportProcessFault", req.SerializeToString(), self._insider(), {"grpc RESOURCE_EXHAUSTED"}
