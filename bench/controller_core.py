"""The controller's own cost of a fault round, without gRPC: N one-agent jobs faulting at once, in process.

bench/controller_scale.py's many-jobs-fault scenario measures the whole server, gRPC and its clients
included; this runs the same round through the same code below gRPC: the `Recover` servicer's methods
(validation, the state machine, the group commit into a real SQLite state file, the signal fan-out to
each job's stream buffer), with the agents' answers made in the same process. At most `--in-flight`
reports are handled per event-loop turn (default 9: the reports per transaction measured at 1,000 to
3,000 jobs over gRPC), so the group commit writes transactions of the size the server writes. The
figure is CPU seconds of this process for the round (the standalone server's GC settings), and per
report; what the agents' side of it costs (building requests, parsing signals) is included, and small.

    python bench/controller_core.py [--quick] [--sizes 1000,10000] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import header, table, write_result

from taskd.controller.config import ControllerConfig
from taskd.controller.core import ControllerCore
from taskd.controller.machine.state_machine import AgentConnected
from taskd.controller.service.hub import SignalHub, Subscriber
from taskd.controller.service.server import GC_THRESHOLDS
from taskd.controller.service.servicers import RecoverService
from taskd.controller.storage.store import Store
from taskd.proto import recover_pb2 as P

STRATEGIES = ["recover", "job-rescheduling", "exit"]
OK = P.Status(code=0, info="ok")


async def _setup(n: int, state: Path) -> tuple[ControllerCore, RecoverService, list[P.ClientInfo], list[Subscriber]]:
    cfg = ControllerConfig(stop_timeout=3600, strategy_timeout=3600, recover_timeout=3600, settle_window=0, max_jobs=n)
    core = ControllerCore(cfg.machine_config(), Store(state), SignalHub(), max_jobs=n)
    svc = RecoverService(core)
    infos = [P.ClientInfo(jobId=f"bench-jobs-{i}", role="agent", nodeRank=0, nodeCount=1, ranksPerNode=1,
                          maxRestarts=1000, host=f"sim-{i}", pid=1000 + i, strategies=STRATEGIES) for i in range(n)]
    subs = []
    for info in infos:
        if (st := await svc.Init(info, None)).code != 0:
            raise RuntimeError(f"Init answered {st.code}: {st.info}")
    for st in await asyncio.gather(*(svc.Register(info, None) for info in infos)):
        if st.code != 0:
            raise RuntimeError(f"Register answered {st.code}: {st.info}")
    for info in infos:  # what SubscribeProcessManageSignal does, without the stream
        sub = core.hub.subscribe(info.jobId, 0)
        core.dispatch(info.jobId, AgentConnected(node_rank=0, host=info.host, pid=info.pid), reply_to=sub)
        subs.append(sub)
    core.flush_soft()
    for sub in subs:
        while sub.pending():
            sub.get_nowait()
    return core, svc, infos, subs


async def _job(svc: RecoverService, info: P.ClientInfo, sub: Subscriber, gate: asyncio.Semaphore) -> str:
    """One agent's round: its fault, then an answer to each signal, as bench/sim_agents.py's agents answer."""
    job, host, pid = info.jobId, info.host, info.pid
    async with gate:
        st = await svc.ReportProcessFault(P.ProcessFaultRequest(
            jobId=job, nodeRank=0, detail="bench", host=host, pid=pid,
            faultRanks=[P.FaultRank(rankId="0", faultType="1")]), None)
    if st.code != 0:
        raise RuntimeError(f"{job}: ReportProcessFault answered {st.code}: {st.info}")
    while True:
        while not sub.pending():
            await asyncio.sleep(0)
        msg = P.ProcessManageSignal.FromString(sub.get_nowait())
        async with gate:
            if msg.signalType == "stopTrain":
                st = await svc.ReportStopComplete(P.StopCompleteRequest(
                    jobId=job, status=OK, faultRanks=msg.faultRanks, nodeRank=0, host=host, pid=pid), None)
            elif msg.signalType == "globalFault":
                st = await svc.ReportRecoverStrategy(P.RecoverStrategyRequest(
                    jobId=job, faultRanks=msg.faultRanks, strategies=STRATEGIES, nodeRank=0, host=host, pid=pid), None)
            elif msg.signalType == "changeStrategy":
                st = await svc.ReportRecoverStatus(P.RecoverStatusRequest(
                    jobId=job, status=OK, strategy=msg.changeStrategy, nodeRank=0, host=host, pid=pid), None)
                if st.code != 0:
                    raise RuntimeError(f"{job}: ReportRecoverStatus answered {st.code}: {st.info}")
                return msg.changeStrategy
        if st.code != 0:
            raise RuntimeError(f"{job}: {msg.signalType} answered {st.code}: {st.info}")


async def one_round(n: int, in_flight: int, work: Path) -> dict[str, Any]:
    core, svc, infos, subs = await _setup(n, work / f"state-{n}-{time.monotonic_ns()}.sqlite3")
    core.group.window = 0.0  # commit every loop turn: the batch size is what --in-flight lets in
    gate = asyncio.Semaphore(in_flight)
    tx0, rep0 = core.group.transactions, core.group.committed
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    strategies = await asyncio.gather(*(_job(svc, info, sub, gate) for info, sub in zip(infos, subs, strict=True)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    reports = core.group.committed - rep0
    core.store.close()
    return {"n": n, "cpu_s": cpu, "wall_s": wall, "reports": reports, "transactions": core.group.transactions - tx0,
            "strategies": sorted(set(strategies))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    p.add_argument("--sizes", default="1000,10000", help="job counts N")
    p.add_argument("--reps", type=int, default=3, help="rounds per N (a fresh controller each)")
    p.add_argument("--in-flight", type=int, default=9, help="reports handled per event-loop turn")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        sizes, args.reps = [50], 1
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)  # as `taskd server` runs (server.tune_gc)
    result = header("controller_core", args)
    result["runs"] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="taskd-bench-core-") as tmp:
        for n in sizes:
            runs = [asyncio.run(one_round(n, args.in_flight, Path(tmp))) for _ in range(args.reps)]
            result["runs"].extend(runs)
            cpu = [r["cpu_s"] for r in runs]
            reports = runs[0]["reports"]
            rows.append([n, statistics.median(cpu), min(cpu), max(cpu), statistics.median(cpu) / reports * 1e6,
                         reports / statistics.median(r["transactions"] for r in runs),
                         ",".join(runs[0]["strategies"])])
    print(f"The controller's own cost of one fault round, N one-agent jobs at once, no gRPC "
          f"({args.reps} rounds per N, {args.in_flight} reports per loop turn)")
    print(table(["N jobs", "CPU s (median)", "min", "max", "us per report", "reports per transaction", "strategies"],
                rows, 2))
    write_result("controller_core", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
