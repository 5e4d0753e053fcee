"""The floor under bench/controller_scale.py's many-jobs-fault scenario: the `Recover` wire with no controller.

A grpc.aio server on the same service paths and messages as `taskd server` that keeps nothing but one
signal queue per job: Init and Register answer 0; the signal stream sends a keep-alive, then what the
job's queue holds; ReportProcessFault queues a stopTrain, ReportStopComplete a globalFault,
ReportRecoverStrategy a changeStrategy `recover`, ReportRecoverStatus answers 0. No state machine, no
store, no interceptor (no token, no per-peer limits), no keep-alive ticker, no connection watch; taskd
server's gRPC options. Run with the same simulated agents, it measures what gRPC and the clients alone
cost for the same 7 operations per job: what is left for the controller to cut is the difference.

    python bench/null_controller.py --listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator

import grpc

from taskd.controller.config import ControllerConfig
from taskd.proto import recover_pb2
from taskd.vocabulary import SignalType

P = recover_pb2
OK = P.Status(code=0, info="ok")


class NullRecover:
    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[bytes]] = {}
        self.seq = 0

    def _push(self, job: str, kind: str, rank: str = "0", strategy: str = "") -> None:
        self.seq += 1
        msg = P.ProcessManageSignal(uuid=f"{job}-{self.seq}", jobId=job, signalType=kind, actions=["x"],
                                    faultRanks=[P.FaultRank(rankId=rank, faultType="1")], changeStrategy=strategy,
                                    nodeRankIds=["0"])
        self.queues.setdefault(job, asyncio.Queue()).put_nowait(msg.SerializeToString())

    async def Init(self, request: P.ClientInfo, context: grpc.aio.ServicerContext) -> P.Status:
        return OK

    async def Register(self, request: P.ClientInfo, context: grpc.aio.ServicerContext) -> P.Status:
        return OK

    async def HealthCheck(self, request: P.ClientInfo, context: grpc.aio.ServicerContext) -> P.Status:
        return OK

    async def SubscribeProcessManageSignal(self, request: P.ClientInfo, context: grpc.aio.ServicerContext
                                           ) -> AsyncIterator[bytes]:
        queue = self.queues.setdefault(request.jobId, asyncio.Queue())
        yield P.ProcessManageSignal(uuid="k", jobId=request.jobId, signalType=SignalType.KEEP_ALIVE).SerializeToString()
        while True:
            yield await queue.get()

    async def ReportProcessFault(self, request: P.ProcessFaultRequest, context: grpc.aio.ServicerContext
                                 ) -> P.Status:
        self._push(request.jobId, SignalType.STOP_TRAIN)
        return OK

    async def ReportStopComplete(self, request: P.StopCompleteRequest, context: grpc.aio.ServicerContext
                                 ) -> P.Status:
        self._push(request.jobId, SignalType.GLOBAL_FAULT)
        return OK

    async def ReportRecoverStrategy(self, request: P.RecoverStrategyRequest, context: grpc.aio.ServicerContext
                                    ) -> P.Status:
        self._push(request.jobId, SignalType.CHANGE_STRATEGY, strategy="recover")
        return OK

    async def ReportRecoverStatus(self, request: P.RecoverStatusRequest, context: grpc.aio.ServicerContext
                                  ) -> P.Status:
        return OK


def handler(svc: NullRecover) -> grpc.GenericRpcHandler:
    unary = {
        "Init": P.ClientInfo, "Register": P.ClientInfo, "HealthCheck": P.ClientInfo,
        "ReportStopComplete": P.StopCompleteRequest, "ReportRecoverStrategy": P.RecoverStrategyRequest,
        "ReportRecoverStatus": P.RecoverStatusRequest, "ReportProcessFault": P.ProcessFaultRequest,
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(getattr(svc, name), request_deserializer=req.FromString,
                                                          response_serializer=P.Status.SerializeToString)
                for name, req in unary.items()}
    handlers["SubscribeProcessManageSignal"] = grpc.unary_stream_rpc_method_handler(
        svc.SubscribeProcessManageSignal, request_deserializer=P.ClientInfo.FromString,
        response_serializer=lambda b: b)
    return grpc.method_handlers_generic_handler("Recover", handlers)


async def serve(listen: str) -> None:
    # taskd server's own gRPC options (its pending-call limits, ping policy, no BDP probe, ...)
    server = grpc.aio.server(options=ControllerConfig().grpc_options())
    server.add_generic_rpc_handlers((handler(NullRecover()),))
    server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True)
    asyncio.run(serve(p.parse_args().listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
