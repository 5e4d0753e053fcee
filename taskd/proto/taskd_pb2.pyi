from . import recover_pb2 as _recover_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishRequest(_message.Message):
    __slots__ = ("jobId", "nodeRank", "exitCode", "message", "host", "pid")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    EXITCODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    exitCode: int
    message: str
    host: str
    pid: int
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., exitCode: _Optional[int] = ..., message: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RankPace(_message.Message):
    __slots__ = ("rank", "computeSeconds", "steps")
    RANK_FIELD_NUMBER: _ClassVar[int]
    COMPUTESECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    computeSeconds: float
    steps: int
    def __init__(self, rank: _Optional[int] = ..., computeSeconds: _Optional[float] = ..., steps: _Optional[int] = ...) -> None: ...

class PaceRequest(_message.Message):
    __slots__ = ("jobId", "nodeRank", "host", "pid", "factor", "ranks")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    host: str
    pid: int
    factor: float
    ranks: _containers.RepeatedCompositeFieldContainer[RankPace]
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., factor: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[RankPace, _Mapping]]] = ...) -> None: ...

class StragglerRecord(_message.Message):
    __slots__ = ("rank", "nodeRank", "host", "ratio", "computeSeconds", "medianSeconds", "since", "cleared")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    COMPUTESECONDS_FIELD_NUMBER: _ClassVar[int]
    MEDIANSECONDS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    rank: int
    nodeRank: int
    host: str
    ratio: float
    computeSeconds: float
    medianSeconds: float
    since: float
    cleared: bool
    def __init__(self, rank: _Optional[int] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., ratio: _Optional[float] = ..., computeSeconds: _Optional[float] = ..., medianSeconds: _Optional[float] = ..., since: _Optional[float] = ..., cleared: bool = ...) -> None: ...

class PaceReply(_message.Message):
    __slots__ = ("status", "verdicts")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    status: _recover_pb2.Status
    verdicts: _containers.RepeatedCompositeFieldContainer[StragglerRecord]
    def __init__(self, status: _Optional[_Union[_recover_pb2.Status, _Mapping]] = ..., verdicts: _Optional[_Iterable[_Union[StragglerRecord, _Mapping]]] = ...) -> None: ...

class ResumedRequest(_message.Message):
    __slots__ = ("jobId", "nodeRank", "host", "pid", "round", "seconds", "secondsAgo", "unseen", "restores")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECONDSAGO_FIELD_NUMBER: _ClassVar[int]
    UNSEEN_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    host: str
    pid: int
    round: int
    seconds: float
    secondsAgo: float
    unseen: bool
    restores: _containers.RepeatedCompositeFieldContainer[RankRestore]
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., round: _Optional[int] = ..., seconds: _Optional[float] = ..., secondsAgo: _Optional[float] = ..., unseen: bool = ..., restores: _Optional[_Iterable[_Union[RankRestore, _Mapping]]] = ...) -> None: ...

class RankRestore(_message.Message):
    __slots__ = ("rank", "source", "step", "stepsRedone")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPSREDONE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    source: str
    step: int
    stepsRedone: int
    def __init__(self, rank: _Optional[int] = ..., source: _Optional[str] = ..., step: _Optional[int] = ..., stepsRedone: _Optional[int] = ...) -> None: ...

class SnapshotReport(_message.Message):
    __slots__ = ("jobId", "nodeRank", "host", "pid", "address", "newestStep", "replicatedStep", "lagSeconds", "wardNodeRank", "wardStep", "rankNewest", "wards")
    class RankNewestEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class WardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NEWESTSTEP_FIELD_NUMBER: _ClassVar[int]
    REPLICATEDSTEP_FIELD_NUMBER: _ClassVar[int]
    LAGSECONDS_FIELD_NUMBER: _ClassVar[int]
    WARDNODERANK_FIELD_NUMBER: _ClassVar[int]
    WARDSTEP_FIELD_NUMBER: _ClassVar[int]
    RANKNEWEST_FIELD_NUMBER: _ClassVar[int]
    WARDS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    host: str
    pid: int
    address: str
    newestStep: int
    replicatedStep: int
    lagSeconds: float
    wardNodeRank: int
    wardStep: int
    rankNewest: _containers.ScalarMap[int, int]
    wards: _containers.ScalarMap[int, int]
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., newestStep: _Optional[int] = ..., replicatedStep: _Optional[int] = ..., lagSeconds: _Optional[float] = ..., wardNodeRank: _Optional[int] = ..., wardStep: _Optional[int] = ..., rankNewest: _Optional[_Mapping[int, int]] = ..., wards: _Optional[_Mapping[int, int]] = ...) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("status", "buddyNodeRank", "buddyAddress", "holderNodeRank", "holderAddress", "holderStep", "key", "lostNewest", "dropWards")
    class LostNewestEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BUDDYNODERANK_FIELD_NUMBER: _ClassVar[int]
    BUDDYADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOLDERNODERANK_FIELD_NUMBER: _ClassVar[int]
    HOLDERADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOLDERSTEP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LOSTNEWEST_FIELD_NUMBER: _ClassVar[int]
    DROPWARDS_FIELD_NUMBER: _ClassVar[int]
    status: _recover_pb2.Status
    buddyNodeRank: int
    buddyAddress: str
    holderNodeRank: int
    holderAddress: str
    holderStep: int
    key: str
    lostNewest: _containers.ScalarMap[int, int]
    dropWards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_recover_pb2.Status, _Mapping]] = ..., buddyNodeRank: _Optional[int] = ..., buddyAddress: _Optional[str] = ..., holderNodeRank: _Optional[int] = ..., holderAddress: _Optional[str] = ..., holderStep: _Optional[int] = ..., key: _Optional[str] = ..., lostNewest: _Optional[_Mapping[int, int]] = ..., dropWards: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotRecord(_message.Message):
    __slots__ = ("nodeRank", "buddyNodeRank", "newestStep", "replicatedStep", "lagSeconds", "reportedAt")
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    BUDDYNODERANK_FIELD_NUMBER: _ClassVar[int]
    NEWESTSTEP_FIELD_NUMBER: _ClassVar[int]
    REPLICATEDSTEP_FIELD_NUMBER: _ClassVar[int]
    LAGSECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORTEDAT_FIELD_NUMBER: _ClassVar[int]
    nodeRank: int
    buddyNodeRank: int
    newestStep: int
    replicatedStep: int
    lagSeconds: float
    reportedAt: float
    def __init__(self, nodeRank: _Optional[int] = ..., buddyNodeRank: _Optional[int] = ..., newestStep: _Optional[int] = ..., replicatedStep: _Optional[int] = ..., lagSeconds: _Optional[float] = ..., reportedAt: _Optional[float] = ...) -> None: ...

class MigrationReport(_message.Message):
    __slots__ = ("jobId", "nodeRank", "host", "pid", "migration", "migrated", "reason", "rank", "oldPid", "newPid", "step", "pauseSeconds", "resumedSeconds", "generation", "stage")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_FIELD_NUMBER: _ClassVar[int]
    MIGRATED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OLDPID_FIELD_NUMBER: _ClassVar[int]
    NEWPID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PAUSESECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMEDSECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    host: str
    pid: int
    migration: str
    migrated: bool
    reason: str
    rank: int
    oldPid: int
    newPid: int
    step: int
    pauseSeconds: float
    resumedSeconds: float
    generation: int
    stage: str
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., migration: _Optional[str] = ..., migrated: bool = ..., reason: _Optional[str] = ..., rank: _Optional[int] = ..., oldPid: _Optional[int] = ..., newPid: _Optional[int] = ..., step: _Optional[int] = ..., pauseSeconds: _Optional[float] = ..., resumedSeconds: _Optional[float] = ..., generation: _Optional[int] = ..., stage: _Optional[str] = ...) -> None: ...

class MigrateRequest(_message.Message):
    __slots__ = ("jobId", "rank", "timeout", "node")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    rank: int
    timeout: float
    node: int
    def __init__(self, jobId: _Optional[str] = ..., rank: _Optional[int] = ..., timeout: _Optional[float] = ..., node: _Optional[int] = ...) -> None: ...

class MigrateReply(_message.Message):
    __slots__ = ("status", "report")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    status: _recover_pb2.Status
    report: MigrationReport
    def __init__(self, status: _Optional[_Union[_recover_pb2.Status, _Mapping]] = ..., report: _Optional[_Union[MigrationReport, _Mapping]] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("jobId", "nodeRank", "rank", "step", "data", "last")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    rank: int
    step: int
    data: bytes
    last: bool
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., data: _Optional[bytes] = ..., last: bool = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("jobId", "nodeRank")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    nodeRank: int
    def __init__(self, jobId: _Optional[str] = ..., nodeRank: _Optional[int] = ...) -> None: ...

class JobQuery(_message.Message):
    __slots__ = ("jobId", "pageSize", "pageToken")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    PAGESIZE_FIELD_NUMBER: _ClassVar[int]
    PAGETOKEN_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    pageSize: int
    pageToken: str
    def __init__(self, jobId: _Optional[str] = ..., pageSize: _Optional[int] = ..., pageToken: _Optional[str] = ...) -> None: ...

class AgentRecord(_message.Message):
    __slots__ = ("nodeRank", "role", "host", "pid", "ranksPerNode", "subscribed", "registeredAt", "lastSeen", "finished", "exitCode", "standby")
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANKSPERNODE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    REGISTEREDAT_FIELD_NUMBER: _ClassVar[int]
    LASTSEEN_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    EXITCODE_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    nodeRank: int
    role: str
    host: str
    pid: int
    ranksPerNode: int
    subscribed: bool
    registeredAt: float
    lastSeen: float
    finished: bool
    exitCode: int
    standby: bool
    def __init__(self, nodeRank: _Optional[int] = ..., role: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., ranksPerNode: _Optional[int] = ..., subscribed: bool = ..., registeredAt: _Optional[float] = ..., lastSeen: _Optional[float] = ..., finished: bool = ..., exitCode: _Optional[int] = ..., standby: bool = ...) -> None: ...

class RoundRecord(_message.Message):
    __slots__ = ("round", "startedAt", "endedAt", "faultRanks", "strategiesTried", "strategy", "outcome", "durationSeconds", "nodeLosses", "secondsToTrainingResumed")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STARTEDAT_FIELD_NUMBER: _ClassVar[int]
    ENDEDAT_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    STRATEGIESTRIED_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DURATIONSECONDS_FIELD_NUMBER: _ClassVar[int]
    NODELOSSES_FIELD_NUMBER: _ClassVar[int]
    SECONDSTOTRAININGRESUMED_FIELD_NUMBER: _ClassVar[int]
    round: int
    startedAt: float
    endedAt: float
    faultRanks: _containers.RepeatedCompositeFieldContainer[_recover_pb2.FaultRank]
    strategiesTried: _containers.RepeatedScalarFieldContainer[str]
    strategy: str
    outcome: str
    durationSeconds: float
    nodeLosses: _containers.RepeatedCompositeFieldContainer[NodeLossRecord]
    secondsToTrainingResumed: float
    def __init__(self, round: _Optional[int] = ..., startedAt: _Optional[float] = ..., endedAt: _Optional[float] = ..., faultRanks: _Optional[_Iterable[_Union[_recover_pb2.FaultRank, _Mapping]]] = ..., strategiesTried: _Optional[_Iterable[str]] = ..., strategy: _Optional[str] = ..., outcome: _Optional[str] = ..., durationSeconds: _Optional[float] = ..., nodeLosses: _Optional[_Iterable[_Union[NodeLossRecord, _Mapping]]] = ..., secondsToTrainingResumed: _Optional[float] = ...) -> None: ...

class NodeLossRecord(_message.Message):
    __slots__ = ("nodeRank", "oldHost", "oldPid", "lostAt", "newHost", "newPid", "replacedAt", "secondsToRoundEnd", "standby", "secondsToTrainingResumed")
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    OLDHOST_FIELD_NUMBER: _ClassVar[int]
    OLDPID_FIELD_NUMBER: _ClassVar[int]
    LOSTAT_FIELD_NUMBER: _ClassVar[int]
    NEWHOST_FIELD_NUMBER: _ClassVar[int]
    NEWPID_FIELD_NUMBER: _ClassVar[int]
    REPLACEDAT_FIELD_NUMBER: _ClassVar[int]
    SECONDSTOROUNDEND_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    SECONDSTOTRAININGRESUMED_FIELD_NUMBER: _ClassVar[int]
    nodeRank: int
    oldHost: str
    oldPid: int
    lostAt: float
    newHost: str
    newPid: int
    replacedAt: float
    secondsToRoundEnd: float
    standby: bool
    secondsToTrainingResumed: float
    def __init__(self, nodeRank: _Optional[int] = ..., oldHost: _Optional[str] = ..., oldPid: _Optional[int] = ..., lostAt: _Optional[float] = ..., newHost: _Optional[str] = ..., newPid: _Optional[int] = ..., replacedAt: _Optional[float] = ..., secondsToRoundEnd: _Optional[float] = ..., standby: bool = ..., secondsToTrainingResumed: _Optional[float] = ...) -> None: ...

class EventRecord(_message.Message):
    __slots__ = ("time", "kind", "round", "detail")
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    time: float
    kind: str
    round: int
    detail: str
    def __init__(self, time: _Optional[float] = ..., kind: _Optional[str] = ..., round: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class JobRecord(_message.Message):
    __slots__ = ("jobId", "state", "nodeCount", "ranksPerNode", "restarts", "maxRestarts", "createdAt", "updatedAt", "agents", "rounds", "events", "info", "rejoining", "stragglers", "absent", "worldSize", "snapshots")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODECOUNT_FIELD_NUMBER: _ClassVar[int]
    RANKSPERNODE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAXRESTARTS_FIELD_NUMBER: _ClassVar[int]
    CREATEDAT_FIELD_NUMBER: _ClassVar[int]
    UPDATEDAT_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    REJOINING_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    WORLDSIZE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    state: str
    nodeCount: int
    ranksPerNode: int
    restarts: int
    maxRestarts: int
    createdAt: float
    updatedAt: float
    agents: _containers.RepeatedCompositeFieldContainer[AgentRecord]
    rounds: _containers.RepeatedCompositeFieldContainer[RoundRecord]
    events: _containers.RepeatedCompositeFieldContainer[EventRecord]
    info: str
    rejoining: _containers.RepeatedScalarFieldContainer[int]
    stragglers: _containers.RepeatedCompositeFieldContainer[StragglerRecord]
    absent: _containers.RepeatedScalarFieldContainer[int]
    worldSize: int
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotRecord]
    def __init__(self, jobId: _Optional[str] = ..., state: _Optional[str] = ..., nodeCount: _Optional[int] = ..., ranksPerNode: _Optional[int] = ..., restarts: _Optional[int] = ..., maxRestarts: _Optional[int] = ..., createdAt: _Optional[float] = ..., updatedAt: _Optional[float] = ..., agents: _Optional[_Iterable[_Union[AgentRecord, _Mapping]]] = ..., rounds: _Optional[_Iterable[_Union[RoundRecord, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[EventRecord, _Mapping]]] = ..., info: _Optional[str] = ..., rejoining: _Optional[_Iterable[int]] = ..., stragglers: _Optional[_Iterable[_Union[StragglerRecord, _Mapping]]] = ..., absent: _Optional[_Iterable[int]] = ..., worldSize: _Optional[int] = ..., snapshots: _Optional[_Iterable[_Union[SnapshotRecord, _Mapping]]] = ...) -> None: ...

class JobList(_message.Message):
    __slots__ = ("status", "jobs", "nextPageToken")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXTPAGETOKEN_FIELD_NUMBER: _ClassVar[int]
    status: _recover_pb2.Status
    jobs: _containers.RepeatedCompositeFieldContainer[JobRecord]
    nextPageToken: str
    def __init__(self, status: _Optional[_Union[_recover_pb2.Status, _Mapping]] = ..., jobs: _Optional[_Iterable[_Union[JobRecord, _Mapping]]] = ..., nextPageToken: _Optional[str] = ...) -> None: ...
