"""Simulated agents for bench/controller_scale.py: many grpc.aio clients of one job in one process.

Each agent does what taskd's client does: Init, Register, SubscribeProcessManageSignal, and on a
broken stream waits a jittered backoff (taskd's Backoff, 0.5 s doubling to 10 s) and starts over.
Commands arrive as JSON lines on stdin, answers leave as JSON lines on stdout:

- {"cmd": "ready"}: wait until every agent's stream delivered a first message (a keep-alive).
- {"cmd": "wait", "count": k}: wait until every agent received k non-keep-alive signals; answer the
  receive times of the k-th.
- {"cmd": "report", "calls": n, "concurrency": c, "distinct": bool}: ReportProcessFault calls.
- {"cmd": "resubscribed", "generation": g}: wait until every agent's stream number g delivered a
  message; answer when, and the attempts refused on the way.

With --one-job-each, agent i is the only agent (node 0 of 1) of job "<job>-<i>", and it answers its
rounds as taskd's agent does: stopTrain -> ReportStopComplete, globalFault -> ReportRecoverStrategy,
changeStrategy -> ReportRecoverStatus. Then:

- {"cmd": "fault"}: every agent reports a fault of its rank 0 at once (one ReportProcessFault each,
  all in flight together); answer the codes.
- {"cmd": "recovered"}: wait until every agent received its changeStrategy and its ReportRecoverStatus
  was answered; answer each agent's fault report sent -> changeStrategy received, the strategies and codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter

import grpc

from taskd.proto import recover_pb2, recover_pb2_grpc
from taskd.toolkit.recover_module.backoff import Backoff

KEEP_ALIVE = "keep-alive"


class Agent:
    def __init__(self, node: int, stub: recover_pb2_grpc.RecoverStub, info: recover_pb2.ClientInfo) -> None:
        self.node = node
        self.stub = stub
        self.info = info
        self.generation = 0  # streams established so far
        self.established_at: list[float] = []
        self.signals: list[float] = []  # receive times of non-keep-alive signals
        self.refused: Counter[str] = Counter()
        self.answers = False  # answer the round's signals (--one-job-each)
        self.fault_sent: float | None = None
        self.changed: tuple[float, str] | None = None  # changeStrategy received: when, which strategy
        self.status_code: str | None = None  # the answer to ReportRecoverStatus
        self.replies: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        backoff = Backoff(0.5, 10.0)
        while True:
            established = False
            try:
                st = await self.stub.Init(self.info, timeout=60)
                if st.code != 0:
                    raise _Refused(f"Init:{st.code}")
                st = await self.stub.Register(self.info, timeout=60)
                if st.code != 0:
                    raise _Refused(f"Register:{st.code}")
                call = self.stub.SubscribeProcessManageSignal(self.info)
                async for msg in call:
                    now = time.time()
                    if not established:
                        established = True
                        self.generation += 1
                        self.established_at.append(now)
                        backoff.reset()
                    if msg.signalType != KEEP_ALIVE:
                        self.signals.append(now)
                        if self.answers:
                            self._answer(msg, now)
            except _Refused as exc:
                self.refused[str(exc)] += 1
            except grpc.aio.AioRpcError as exc:
                if not established:
                    self.refused[exc.code().name] += 1
            await asyncio.sleep(backoff.next_delay())


    def _answer(self, msg: recover_pb2.ProcessManageSignal, now: float) -> None:
        """Answer a round's signal as taskd's agent does, without holding up the stream."""
        if msg.signalType == "changeStrategy" and self.changed is None:
            self.changed = (now, msg.changeStrategy)
        task = asyncio.create_task(self._reply(msg))
        self.replies.add(task)
        task.add_done_callback(self.replies.discard)

    async def _reply(self, msg: recover_pb2.ProcessManageSignal) -> None:
        job, host, pid = self.info.jobId, self.info.host, self.info.pid
        ok = recover_pb2.Status(code=0, info="ok")
        try:
            if msg.signalType == "stopTrain":
                await self._call(self.stub.ReportStopComplete, recover_pb2.StopCompleteRequest(
                    jobId=job, status=ok, faultRanks=msg.faultRanks, nodeRank=0, host=host, pid=pid))
            elif msg.signalType == "globalFault":
                await self._call(self.stub.ReportRecoverStrategy, recover_pb2.RecoverStrategyRequest(
                    jobId=job, faultRanks=msg.faultRanks, strategies=["recover", "job-rescheduling", "exit"],
                    nodeRank=0, host=host, pid=pid))
            elif msg.signalType == "changeStrategy":
                st = await self._call(self.stub.ReportRecoverStatus, recover_pb2.RecoverStatusRequest(
                    jobId=job, status=ok, strategy=msg.changeStrategy, nodeRank=0, host=host, pid=pid))
                self.status_code = str(st.code)
        except grpc.aio.AioRpcError as exc:
            self.refused[f"{msg.signalType}:{exc.code().name}"] += 1
            if msg.signalType == "changeStrategy":
                self.status_code = exc.code().name

    async def _call(self, method, request, budget: float = 60.0):  # noqa: ANN001, ANN202
        """One report, sent again after UNAVAILABLE (a broken connection) within `budget`, as taskd's agent does."""
        deadline = time.monotonic() + budget
        while True:
            try:
                return await method(request, timeout=120)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                self.refused[f"retried:{type(request).__name__}"] += 1
                await asyncio.sleep(0.1)

    async def report_fault(self) -> str:
        req = recover_pb2.ProcessFaultRequest(jobId=self.info.jobId, nodeRank=0, detail="bench: all jobs at once",
                                              host=self.info.host, pid=self.info.pid,
                                              faultRanks=[recover_pb2.FaultRank(rankId="0", faultType="1")])
        self.fault_sent = time.time()
        try:
            st = await self._call(self.stub.ReportProcessFault, req)
            return str(st.code)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name


class _Refused(Exception):
    pass


async def wait_all(cond, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def report(agents: list[Agent], calls: int, concurrency: int, distinct: bool, job: str) -> dict[str, object]:
    sem = asyncio.Semaphore(concurrency)
    codes: Counter[str] = Counter()

    async def one(i: int) -> None:
        a = agents[i % len(agents)]
        rank = a.node if distinct else 0
        req = recover_pb2.ProcessFaultRequest(jobId=job, nodeRank=a.node, detail="bench",
                                              faultRanks=[recover_pb2.FaultRank(rankId=str(rank), faultType="1")])
        async with sem:
            try:
                st = await a.stub.ReportProcessFault(req, timeout=120)
                codes[str(st.code)] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

    t0 = time.time()
    await asyncio.gather(*(one(i) for i in range(calls)))
    return {"t0": t0, "t1": time.time(), "codes": dict(codes)}


async def main_async(args: argparse.Namespace) -> None:
    opts = [("grpc.keepalive_time_ms", 20000), ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.use_local_subchannel_pool", 1)]
    channels = []
    agents: list[Agent] = []
    for i in range(args.count):
        if i % args.per_channel == 0:
            channels.append(grpc.aio.insecure_channel(args.address, options=opts))
        node = args.first + i
        if args.one_job_each:
            job, rank, nodes = f"{args.job}-{node}", 0, 1
        else:
            job, rank, nodes = args.job, node, args.nodes
        info = recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=rank, nodeCount=nodes,
                                      ranksPerNode=1, maxRestarts=1000, host=f"sim-{node}", pid=os.getpid(),
                                      strategies=["recover", "job-rescheduling", "exit"])
        agents.append(Agent(node, recover_pb2_grpc.RecoverStub(channels[-1]), info))
        agents[-1].answers = args.one_job_each
    tasks = []
    for a in agents:  # stagger the start a little: a real job's agents do not start in the same microsecond
        tasks.append(asyncio.create_task(a.run()))
        if len(tasks) % 200 == 0:
            await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(obj: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        timeout = float(cmd.get("timeout", 300))
        if cmd["cmd"] == "ready":
            ok = await wait_all(lambda: all(a.generation >= 1 for a in agents), timeout)
            answer({"ok": ok, "ready": sum(a.generation >= 1 for a in agents),
                    "refused": dict(sum((a.refused for a in agents), Counter()))})
        elif cmd["cmd"] == "wait":
            k = int(cmd["count"])
            ok = await wait_all(lambda k=k: all(len(a.signals) >= k for a in agents), timeout)
            answer({"ok": ok, "times": [a.signals[k - 1] for a in agents if len(a.signals) >= k]})
        elif cmd["cmd"] == "report":
            answer(await report(agents, int(cmd["calls"]), int(cmd["concurrency"]), bool(cmd["distinct"]), args.job))
        elif cmd["cmd"] == "resubscribed":
            g = int(cmd["generation"])
            ok = await wait_all(lambda g=g: all(a.generation >= g for a in agents), timeout)
            answer({"ok": ok, "times": [a.established_at[g - 1] for a in agents if a.generation >= g],
                    "refused": dict(sum((a.refused for a in agents), Counter())),
                    "signals": [len(a.signals) for a in agents]})
        elif cmd["cmd"] == "fault":
            codes = await asyncio.gather(*(a.report_fault() for a in agents))
            answer({"codes": dict(Counter(codes))})
        elif cmd["cmd"] == "recovered":
            ok = await wait_all(lambda: all(a.status_code is not None for a in agents), timeout)
            done = [a for a in agents if a.changed is not None and a.fault_sent is not None]
            answer({"ok": ok, "latency": [a.changed[0] - a.fault_sent for a in done],
                    "changed_at": [a.changed[0] for a in done], "fault_sent": [a.fault_sent for a in agents
                                                                              if a.fault_sent is not None],
                    "strategies": dict(Counter(a.changed[1] for a in done)),
                    "status_codes": dict(Counter(str(a.status_code) for a in agents)),
                    "refused": dict(sum((a.refused for a in agents), Counter()))})
        elif cmd["cmd"] == "quit":
            break
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close(None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--first", type=int, required=True, help="first node rank simulated here")
    p.add_argument("--count", type=int, required=True, help="agents simulated here")
    p.add_argument("--nodes", type=int, required=True, help="node count of the job")
    p.add_argument("--per-channel", type=int, default=1, help="agents sharing one connection")
    p.add_argument("--one-job-each", action="store_true", help="each agent is the one node of its own job")
    asyncio.run(main_async(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
