"""grpc.aio servicers: `Recover` (ClusterD-compatible), `taskd.v1.AgentReport`, `taskd.v1.JobStatus`.

Thin on purpose: validate the request (409 naming the field), turn it into a state-machine
event, hand it to the core, answer with the outcome's code and info.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from taskd.controller.core import ControllerCore
from taskd.controller.machine.events import (
    MigrationReported,
    MigrationRequested,
    PaceReported,
    StandbyConnected,
    StandbyDisconnected,
    TrainingResumed,
)
from taskd.controller.machine.model import fault_runs
from taskd.controller.machine.state_machine import (
    AgentConnected,
    AgentDisconnected,
    AgentFinished,
    AgentRegistered,
    FaultReported,
    JobInit,
    Outcome,
    RecoverStatusReported,
    StopComplete,
    StrategiesReported,
)
from taskd.controller.nodes.migration import MigrationWaits
from taskd.controller.nodes.node_loss import fence_refusal
from taskd.controller.nodes.replicas import on_report
from taskd.controller.nodes.stragglers import straggler_records
from taskd.controller.service import validation as v
from taskd.controller.service.hub import keepalive_wire
from taskd.controller.storage.quota import MAX_FAULT_RUNS, JobLimits
from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import Code

log = logging.getLogger(__name__)

Status = recover_pb2.Status


def _invalid(info: str) -> Status:
    return Status(code=Code.INVALID_PARAMS, info=info)


def _answer(out: Outcome, method: str, job_id: str, limits: JobLimits) -> Status:
    """The wire answer; a refusal is logged, at most --max-job-log-lines per job (quota.py), and a quota's refusal
    not twice (the core logged it)."""
    if out.code not in (Code.OK, Code.QUOTA_EXCEEDED):
        limits.note(job_id, log, "%s for job %s answered %d: %s", method, job_id, out.code, out.info)
    return Status(code=out.code, info=out.info)


class RecoverService(recover_pb2_grpc.RecoverServicer):
    def __init__(self, core: ControllerCore, max_node_count: int = 65536, max_ranks: int = v.RANK_LIMIT) -> None:
        self.core = core
        self.max_node_count = max_node_count
        self.max_ranks = max_ranks

    def _check_client(self, request: recover_pb2.ClientInfo) -> str:
        return v.check_client(request, self.max_node_count, self.max_ranks)

    def _ranks(self, job_id: str, name: str, ranks: list[int], node_rank: int | None = None) -> Status | None:
        """A refusal for ranks the job does not have (checked before the core sees the request), else None."""
        job = self.core.jobs.get(job_id)
        if job is None:
            return None  # the core answers 402 for an unknown job
        node = None
        if node_rank is not None and (agent := job.agents.get(node_rank)) is not None:
            node = (node_rank, agent.ranks_per_node or job.ranks_per_node)
        code, why = v.rank_refusal(ranks, name, v.world_size(job.node_count, job.ranks_per_node), node,
                                   max_ranks=self.max_ranks)
        if code:
            self.core.limits.note(job_id, log, "job %s: refused ranks from node %d: %s", job_id,
                                  node_rank if node_rank is not None else -1, why)
            return Status(code=code, info=why)
        return None

    def _runs(self, job_id: str, faults: dict[int, str]) -> Status | None:
        """409 for a report whose faults, with its job's open round's, form more than MAX_FAULT_RUNS runs of
        consecutive ranks: what one report costs (its history records, the round's fault text, the log line)
        grows with the runs, not the ranks (quota.py)."""
        job = self.core.jobs.get(job_id)
        merged = {**job.round.faults, **faults} if job is not None and job.round is not None else faults
        if len(merged) <= MAX_FAULT_RUNS or (n := len(fault_runs(merged))) <= MAX_FAULT_RUNS:
            return None
        why = (f"faultRanks names ranks that form {n} separate runs of consecutive ranks (of one fault type) with the "
               f"job's open round, more than {MAX_FAULT_RUNS}: report them in fewer runs, or give ranksPerNode at Init")
        self.core.limits.note(job_id, log, "job %s: refused a fault report: %s", job_id, why)
        return Status(code=Code.INVALID_PARAMS, info=why)

    async def Init(self, request: recover_pb2.ClientInfo, context: grpc.aio.ServicerContext) -> Status:
        if why := self._check_client(request):
            return _invalid(why)
        ev = JobInit(
            node_count=request.nodeCount, ranks_per_node=request.ranksPerNode,
            max_restarts=request.maxRestarts if request.HasField("maxRestarts") else None,
            strategies=v.unique(request.strategies), node_rank=request.nodeRank, host=request.host, pid=request.pid,
            standby=request.standby, min_nodes=request.minNodes,
        )
        out = self.core.init_job(request.jobId, ev)
        return _answer(out, "Init", request.jobId, self.core.limits)

    async def Register(self, request: recover_pb2.ClientInfo, context: grpc.aio.ServicerContext) -> Status:
        if why := self._check_client(request):
            return _invalid(why)
        ev = AgentRegistered(node_rank=request.nodeRank, role=request.role, host=request.host, pid=request.pid,
                             ranks_per_node=request.ranksPerNode, standby=request.standby,
                             restarts_used=request.restartsUsed)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "Register", request.jobId, self.core.limits)

    async def HealthCheck(self, request: recover_pb2.ClientInfo, context: grpc.aio.ServicerContext) -> Status:
        if why := self._check_client(request):
            return _invalid(why)
        job = self.core.jobs.get(request.jobId)
        if job is None:
            return Status(code=Code.NOT_REGISTERED, info=f"job {request.jobId} does not exist")
        if request.standby and (request.host, request.pid) in job.standbys:
            return Status(code=Code.OK, info=job.state.value)
        if request.nodeRank not in job.agents:
            return Status(code=Code.NOT_REGISTERED,
                          info=f"node {request.nodeRank} of job {request.jobId} is not registered")
        fenced = AgentConnected(node_rank=request.nodeRank, host=request.host, pid=request.pid)
        if why := fence_refusal(job, fenced, self.core.clock()):  # a lost agent that came back, in any job state
            return Status(code=Code.FENCED, info=why)
        return Status(code=Code.OK, info=job.state.value)

    async def SubscribeProcessManageSignal(
        self, request: recover_pb2.ClientInfo, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Yields serialised ProcessManageSignals (the method is registered with a pass-through serializer)."""
        if why := self._check_client(request):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{Code.INVALID_PARAMS}: {why}")
        if self.core.closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "controller shutting down")
        job_id, node = request.jobId, request.nodeRank
        job = self.core.jobs.get(job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{Code.JOB_NOT_EXIST}: job {job_id} does not exist")
        if request.standby:
            async for msg in self._standby_stream(job_id, request, context):
                yield msg
            return
        if node not in job.agents:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{Code.NOT_REGISTERED}: node {node} of job {job_id} is not registered")
        fenced = self.core.fenced(job_id, node, request.host, request.pid)
        if fenced is not None:  # a lost agent that came back: told once why, and its stream ends
            yield fenced
            return
        if why := self.core.holder_refusal(job_id, node, request.host, request.pid):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{Code.INVALID_PARAMS}: {why}")
        job_id = job.job_id  # one string shared by every stream of the job, not a copy per request
        sub = self.core.hub.subscribe(job_id, node)
        # an immediate keep-alive tells the agent its stream is live (it waits for that before starting ranks)
        sub.offer(keepalive_wire(job_id), droppable=True)
        try:
            self.core.dispatch(job_id, AgentConnected(node_rank=node, host=request.host, pid=request.pid), reply_to=sub)
            while True:
                msg = await sub.get()
                if msg is None:
                    log.debug("stream of job %s node %d closed: %s", job_id, node, sub.closed_reason)
                    return
                yield msg
        finally:
            # at shutdown every stream closes at once: a restart marks every agent offline anyway
            if self.core.hub.unsubscribe(sub) and not self.core.closing:
                try:
                    self.core.dispatch(job_id, AgentDisconnected(node_rank=node))
                except Exception:  # e.g. the store already closed during shutdown
                    log.debug("could not record the end of job %s node %d's stream", job_id, node, exc_info=True)

    async def _standby_stream(self, job_id: str, request: recover_pb2.ClientInfo,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """A standby's stream: keep-alives and what is addressed to it (taskd.assignNode, its exit); it ends
        when the standby becomes a node (its client subscribes again as that node) or goes away (forgotten)."""
        key = (request.host, request.pid)
        job = self.core.jobs[job_id]
        if key not in job.standbys:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{Code.NOT_REGISTERED}: no standby {request.host[:64]}:{request.pid} in job {job_id} "
                                "(Register with standby first)")
        job_id = job.job_id
        sub = self.core.hub.subscribe_standby(job_id, key)
        sub.offer(keepalive_wire(job_id), droppable=True)
        try:
            self.core.dispatch(job_id, StandbyConnected(host=request.host, pid=request.pid), reply_to=sub)
            while True:
                msg = await sub.get()
                if msg is None:
                    return
                yield msg
        finally:
            if self.core.hub.unsubscribe(sub) and not self.core.closing:
                try:
                    self.core.dispatch(job_id, StandbyDisconnected(host=request.host, pid=request.pid))
                except Exception:  # e.g. the store already closed during shutdown
                    log.debug("could not record the end of job %s standby %s's stream", job_id, key, exc_info=True)

    async def ReportStopComplete(self, request: recover_pb2.StopCompleteRequest,
                                 context: grpc.aio.ServicerContext) -> Status:
        if why := v.check_stop_complete(request):
            return _invalid(why)
        faults = v.faults_dict(request.faultRanks)
        if refused := self._ranks(request.jobId, "faultRanks", v.rank_list(request.faultRanks)):
            return refused
        ev = StopComplete(node_rank=request.nodeRank, code=request.status.code, info=request.status.info,
                          faults=faults, host=request.host, pid=request.pid)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportStopComplete", request.jobId, self.core.limits)

    async def ReportRecoverStrategy(self, request: recover_pb2.RecoverStrategyRequest,
                                    context: grpc.aio.ServicerContext) -> Status:
        if why := v.check_recover_strategy(request):
            return _invalid(why)
        faults = v.faults_dict(request.faultRanks)
        if refused := self._ranks(request.jobId, "faultRanks", v.rank_list(request.faultRanks)):
            return refused
        ev = StrategiesReported(node_rank=request.nodeRank, strategies=v.unique(request.strategies), faults=faults,
                                host=request.host, pid=request.pid)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportRecoverStrategy", request.jobId, self.core.limits)

    async def ReportRecoverStatus(self, request: recover_pb2.RecoverStatusRequest,
                                  context: grpc.aio.ServicerContext) -> Status:
        if why := v.check_recover_status(request):
            return _invalid(why)
        if refused := self._ranks(request.jobId, "isolateRankIds", [int(r) for r in request.isolateRankIds]):
            return refused
        ev = RecoverStatusReported(node_rank=request.nodeRank, code=request.status.code, info=request.status.info,
                                   strategy=request.strategy, isolate_ranks=tuple(request.isolateRankIds),
                                   host=request.host, pid=request.pid, rejoined=request.rejoined)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportRecoverStatus", request.jobId, self.core.limits)

    async def ReportProcessFault(self, request: recover_pb2.ProcessFaultRequest,
                                 context: grpc.aio.ServicerContext) -> Status:
        if why := v.check_process_fault(request):
            return _invalid(why)
        faults = v.faults_dict(request.faultRanks)
        # a node reports its own ranks: a fault elsewhere is refused before it opens a round or spends a restart
        ranks = v.rank_list(request.faultRanks)
        if refused := self._ranks(request.jobId, "faultRanks", ranks, node_rank=request.nodeRank):
            return refused
        if refused := self._runs(request.jobId, faults):
            return refused
        ev = FaultReported(node_rank=request.nodeRank, faults=faults, detail=request.detail, host=request.host,
                           pid=request.pid)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportProcessFault", request.jobId, self.core.limits)


class AgentReportService(taskd_pb2_grpc.AgentReportServicer):
    def __init__(self, core: ControllerCore, max_ranks: int = v.RANK_LIMIT,
                 credential: Callable[[str], str] | None = None, migrations: MigrationWaits | None = None) -> None:
        self.core = core
        self.max_ranks = max_ranks
        self.credential = credential  # a job's credential under the admin token (None: the controller has none)
        self.migrations = migrations or MigrationWaits()

    async def ReportMigration(self, request: taskd_pb2.MigrationReport, context: grpc.aio.ServicerContext) -> Status:
        """How a planned migration ended (nodes/migration.py): recorded, and the waiting `Migrate` answered."""
        if why := v.check_job_id(request.jobId):
            return _invalid(why)
        ev = MigrationReported(
            node_rank=request.nodeRank, host=request.host, pid=request.pid, migration=request.migration,
            migrated=request.migrated, reason=request.reason, rank=request.rank, old_pid=request.oldPid,
            new_pid=request.newPid, step=request.step, pause_seconds=request.pauseSeconds,
            resumed_seconds=request.resumedSeconds, generation=request.generation, stage=request.stage)
        out = self.core.dispatch(request.jobId, ev)  # a migration's end answers its `Migrate` (core.on_settled)
        return _answer(out, "ReportMigration", request.jobId, self.core.limits)

    async def ReportSnapshots(self, request: taskd_pb2.SnapshotReport, context: grpc.aio.ServicerContext
                              ) -> taskd_pb2.SnapshotReply:
        """A node's snapshot replication (nodes/replicas.py); the answer names its buddy and its copy's holder."""
        if why := v.check_snapshots(request):
            return taskd_pb2.SnapshotReply(status=_invalid(why))
        job = self.core.jobs.get(request.jobId)
        if job is None:
            return taskd_pb2.SnapshotReply(status=Status(code=Code.JOB_NOT_EXIST, info=f"no job {request.jobId!r}"))
        reply = on_report(job, request, self.core.clocks.now(), self.credential)
        reply.status.code = Code.OK
        return reply

    async def ReportFinished(self, request: taskd_pb2.FinishRequest, context: grpc.aio.ServicerContext) -> Status:
        if why := v.check_finish(request.jobId, request.nodeRank, request.message):
            return _invalid(why)
        ev = AgentFinished(node_rank=request.nodeRank, exit_code=request.exitCode, message=request.message,
                           host=request.host, pid=request.pid)
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportFinished", request.jobId, self.core.limits)

    async def ReportResumed(self, request: taskd_pb2.ResumedRequest, context: grpc.aio.ServicerContext) -> Status:
        """A node's ranks train again after a round (controller/machine/resumed.py): stored with the round's history."""
        if why := v.check_resumed(request):
            return _invalid(why)
        ev = TrainingResumed(node_rank=request.nodeRank, host=request.host, pid=request.pid, round=request.round,
                             seconds=request.seconds, seconds_ago=request.secondsAgo, unseen=request.unseen,
                             restores=tuple((r.rank, r.source, r.step, r.stepsRedone) for r in request.restores))
        out = await self.core.group.submit(request.jobId, ev)
        return _answer(out, "ReportResumed", request.jobId, self.core.limits)

    async def ReportPace(self, request: taskd_pb2.PaceRequest, context: grpc.aio.ServicerContext
                         ) -> taskd_pb2.PaceReply:
        """An agent's ranks' pace (controller/nodes/stragglers.py); the answer carries the verdicts about its ranks."""
        if why := v.check_pace(request, self.max_ranks):
            return taskd_pb2.PaceReply(status=_invalid(why))
        job = self.core.jobs.get(request.jobId)
        if job is not None and (agent := job.agents.get(request.nodeRank)) is not None:
            node = (request.nodeRank, agent.ranks_per_node or job.ranks_per_node)
            code, why = v.rank_refusal([r.rank for r in request.ranks], "ranks",
                                       v.world_size(job.node_count, job.ranks_per_node), node, max_ranks=self.max_ranks)
            if code:
                return taskd_pb2.PaceReply(status=Status(code=code, info=why))
        ev = PaceReported(node_rank=request.nodeRank, host=request.host, pid=request.pid, factor=request.factor,
                          paces=tuple((r.rank, r.computeSeconds, r.steps) for r in request.ranks))
        out = self.core.dispatch(request.jobId, ev)
        status = _answer(out, "ReportPace", request.jobId, self.core.limits)
        if status.code != Code.OK:
            return taskd_pb2.PaceReply(status=status)
        return taskd_pb2.PaceReply(status=status, verdicts=straggler_records(
            self.core.jobs.get(request.jobId), self.core.clocks.to_wall, request.nodeRank))


PAGE_BYTES = 2 * 1024 * 1024
"""A page ends before it would pass this many bytes (a client's default receive limit is 4 MB)."""


class JobStatusService(taskd_pb2_grpc.JobStatusServicer):
    def __init__(self, core: ControllerCore) -> None:
        self.core = core

    async def ListJobs(self, request: taskd_pb2.JobQuery, context: grpc.aio.ServicerContext) -> taskd_pb2.JobList:
        if request.jobId and (why := v.check_job_id(request.jobId)):
            return taskd_pb2.JobList(status=_invalid(why))
        if request.pageSize < 0:
            return taskd_pb2.JobList(status=_invalid(f"pageSize must be >= 0, got {request.pageSize}"))
        if request.jobId or (request.pageSize == 0 and not request.pageToken):
            return self.core.job_list(request.jobId)  # one job, or every job at once (callers without paging)
        return self._page(request.pageSize or 1000, request.pageToken)

    def _page(self, size: int, token: str) -> taskd_pb2.JobList:
        """Jobs in creation order after `token` (the last job of the previous page: "<createdAt>:<jobId>")."""
        after: tuple[float, str] | None = None
        if token:
            stamp, sep, job_id = token.partition(":")
            try:
                after = (float(stamp), job_id)
            except ValueError:
                after = None
            if not sep or after is None:
                return taskd_pb2.JobList(status=_invalid(f"pageToken {token[:64]!r} is not one this server gave"))
        keys = sorted((m.created_at, m.job_id) for m in self.core.jobs.values())
        out = taskd_pb2.JobList(status=Status(code=Code.OK))
        used = 0
        last: tuple[float, str] | None = None
        for key in keys:
            if after is not None and key <= after:
                continue
            record = self.core.job_list(key[1]).jobs[0]
            cost = record.ByteSize() + 8
            if out.jobs and last is not None and (len(out.jobs) >= size or used + cost > PAGE_BYTES):
                # the controller's own (monotonic) creation time: the record shows the wall time of it
                out.nextPageToken = f"{last[0]!r}:{last[1]}"
                break
            out.jobs.append(record)
            last = key
            used += cost
        return out


MIGRATE_TIMEOUT = 120.0  # how long `Migrate` waits for the agent's account when the call names no timeout
MIGRATE_TIMEOUT_MAX = 3600.0


class JobControlService(taskd_pb2_grpc.JobControlServicer):
    """`taskd migrate` (controller/nodes/migration.py): ask the rank's agent, then wait for its account."""

    def __init__(self, core: ControllerCore, migrations: MigrationWaits) -> None:
        self.core = core
        self.migrations = migrations

    async def Migrate(self, request: taskd_pb2.MigrateRequest, context: grpc.aio.ServicerContext
                      ) -> taskd_pb2.MigrateReply:
        if why := v.check_job_id(request.jobId):
            return taskd_pb2.MigrateReply(status=_invalid(why))
        if not 0 <= request.timeout <= MIGRATE_TIMEOUT_MAX:
            return taskd_pb2.MigrateReply(status=_invalid(f"timeout must be 0..{MIGRATE_TIMEOUT_MAX:g} seconds, got "
                                                          f"{request.timeout:g}"))
        node = request.node if request.HasField("node") else None
        out = self.core.dispatch(request.jobId, MigrationRequested(rank=request.rank, node=node))
        if out.code != Code.OK:
            return taskd_pb2.MigrateReply(status=Status(code=out.code, info=out.info))
        migration = out.info
        waiting = self.migrations.expect(migration)
        timeout = request.timeout or MIGRATE_TIMEOUT
        try:
            report = await asyncio.wait_for(waiting, timeout)
        except asyncio.TimeoutError:
            return taskd_pb2.MigrateReply(status=Status(code=Code.REPORT_TIMEOUT, info=(
                f"{'node' if node is not None else 'rank'} {request.rank if node is None else node}: no agent said "
                f"within {timeout:g}s how migration {migration} ended "
                "(`taskd status --job` shows it once it does)")))
        finally:
            self.migrations.forget(migration)
        account = taskd_pb2.MigrationReport(
            jobId=request.jobId, nodeRank=report.node_rank, host=report.host, pid=report.pid, migration=migration,
            migrated=report.migrated, reason=report.reason, rank=report.rank, oldPid=report.old_pid,
            newPid=report.new_pid, step=report.step, pauseSeconds=report.pause_seconds,
            resumedSeconds=report.resumed_seconds, generation=report.generation, stage=report.stage)
        code = Code.OK if report.migrated else Code.PROCESS_NOT_READY
        return taskd_pb2.MigrateReply(status=Status(code=code, info=report.reason), report=account)


def _passthrough(data: bytes) -> bytes:
    return data


def recover_handler(svc: RecoverService) -> grpc.GenericRpcHandler:
    """The `Recover` service as the generated code registers it (paths /Recover/<Method>, same request
    types), except that the signal stream sends bytes already serialised once per broadcast."""
    P = recover_pb2
    unary = {
        "Init": P.ClientInfo, "Register": P.ClientInfo, "HealthCheck": P.ClientInfo,
        "ReportStopComplete": P.StopCompleteRequest, "ReportRecoverStrategy": P.RecoverStrategyRequest,
        "ReportRecoverStatus": P.RecoverStatusRequest, "ReportProcessFault": P.ProcessFaultRequest,
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(getattr(svc, name), request_deserializer=req.FromString,
                                                  response_serializer=P.Status.SerializeToString)
        for name, req in unary.items()
    }
    handlers["SubscribeProcessManageSignal"] = grpc.unary_stream_rpc_method_handler(
        svc.SubscribeProcessManageSignal, request_deserializer=P.ClientInfo.FromString,
        response_serializer=_passthrough)
    return grpc.method_handlers_generic_handler("Recover", handlers)


def add_services(server: grpc.aio.Server, core: ControllerCore, max_node_count: int = 65536,
                 max_ranks: int = v.RANK_LIMIT, credential: Callable[[str], str] | None = None) -> None:
    server.add_generic_rpc_handlers((recover_handler(RecoverService(core, max_node_count, max_ranks)),))
    migrations = MigrationWaits()
    core.on_settled = migrations.settle
    taskd_pb2_grpc.add_AgentReportServicer_to_server(AgentReportService(core, max_ranks, credential, migrations),
                                                     server)
    taskd_pb2_grpc.add_JobControlServicer_to_server(JobControlService(core, migrations), server)
    taskd_pb2_grpc.add_JobStatusServicer_to_server(JobStatusService(core), server)
