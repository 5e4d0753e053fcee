from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(_message.Message):
    __slots__ = ("code", "info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    code: int
    info: str
    def __init__(self, code: _Optional[int] = ..., info: _Optional[str] = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("jobId", "role", "nodeRank", "nodeCount", "ranksPerNode", "maxRestarts", "host", "pid", "strategies", "standby", "minNodes", "restartsUsed")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    NODECOUNT_FIELD_NUMBER: _ClassVar[int]
    RANKSPERNODE_FIELD_NUMBER: _ClassVar[int]
    MAXRESTARTS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    MINNODES_FIELD_NUMBER: _ClassVar[int]
    RESTARTSUSED_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    role: str
    nodeRank: int
    nodeCount: int
    ranksPerNode: int
    maxRestarts: int
    host: str
    pid: int
    strategies: _containers.RepeatedScalarFieldContainer[str]
    standby: bool
    minNodes: int
    restartsUsed: int
    def __init__(self, jobId: _Optional[str] = ..., role: _Optional[str] = ..., nodeRank: _Optional[int] = ..., nodeCount: _Optional[int] = ..., ranksPerNode: _Optional[int] = ..., maxRestarts: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., strategies: _Optional[_Iterable[str]] = ..., standby: bool = ..., minNodes: _Optional[int] = ..., restartsUsed: _Optional[int] = ...) -> None: ...

class FaultRank(_message.Message):
    __slots__ = ("rankId", "faultType")
    RANKID_FIELD_NUMBER: _ClassVar[int]
    FAULTTYPE_FIELD_NUMBER: _ClassVar[int]
    rankId: str
    faultType: str
    def __init__(self, rankId: _Optional[str] = ..., faultType: _Optional[str] = ...) -> None: ...

class ProcessManageSignal(_message.Message):
    __slots__ = ("uuid", "jobId", "signalType", "actions", "faultRanks", "changeStrategy", "timeout", "nodeRankIds", "extraParams")
    UUID_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    SIGNALTYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    CHANGESTRATEGY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NODERANKIDS_FIELD_NUMBER: _ClassVar[int]
    EXTRAPARAMS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    jobId: str
    signalType: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    changeStrategy: str
    timeout: int
    nodeRankIds: _containers.RepeatedScalarFieldContainer[str]
    extraParams: str
    def __init__(self, uuid: _Optional[str] = ..., jobId: _Optional[str] = ..., signalType: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., changeStrategy: _Optional[str] = ..., timeout: _Optional[int] = ..., nodeRankIds: _Optional[_Iterable[str]] = ..., extraParams: _Optional[str] = ...) -> None: ...

class StopCompleteRequest(_message.Message):
    __slots__ = ("jobId", "status", "faultRanks", "nodeRank", "host", "pid")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    nodeRank: int
    host: str
    pid: int
    def __init__(self, jobId: _Optional[str] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RecoverStrategyRequest(_message.Message):
    __slots__ = ("jobId", "faultRanks", "strategies", "nodeRank", "host", "pid")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    strategies: _containers.RepeatedScalarFieldContainer[str]
    nodeRank: int
    host: str
    pid: int
    def __init__(self, jobId: _Optional[str] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., strategies: _Optional[_Iterable[str]] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RecoverStatusRequest(_message.Message):
    __slots__ = ("jobId", "status", "strategy", "isolateRankIds", "nodeRank", "host", "pid", "rejoined")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ISOLATERANKIDS_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REJOINED_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    strategy: str
    isolateRankIds: _containers.RepeatedScalarFieldContainer[str]
    nodeRank: int
    host: str
    pid: int
    rejoined: bool
    def __init__(self, jobId: _Optional[str] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., strategy: _Optional[str] = ..., isolateRankIds: _Optional[_Iterable[str]] = ..., nodeRank: _Optional[int] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., rejoined: bool = ...) -> None: ...

class ProcessFaultRequest(_message.Message):
    __slots__ = ("jobId", "faultRanks", "nodeRank", "detail", "host", "pid")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    NODERANK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    nodeRank: int
    detail: str
    host: str
    pid: int
    def __init__(self, jobId: _Optional[str] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., nodeRank: _Optional[int] = ..., detail: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...
