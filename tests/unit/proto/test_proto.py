"""The wire contract: field numbers and names match ClusterD; generated code is current."""

from __future__ import annotations

import pytest

from taskd.proto import recover_pb2, taskd_pb2

# (message, field name, number) straight from ClusterD's recover.proto.
CLUSTERD_FIELDS = [
    ("Status", "code", 1), ("Status", "info", 2),
    ("ClientInfo", "jobId", 1), ("ClientInfo", "role", 2),
    ("FaultRank", "rankId", 1), ("FaultRank", "faultType", 2),
    ("ProcessManageSignal", "uuid", 1), ("ProcessManageSignal", "jobId", 2),
    ("ProcessManageSignal", "signalType", 3), ("ProcessManageSignal", "actions", 4),
    ("ProcessManageSignal", "faultRanks", 5), ("ProcessManageSignal", "changeStrategy", 6),
    ("ProcessManageSignal", "timeout", 7), ("ProcessManageSignal", "nodeRankIds", 8),
    ("ProcessManageSignal", "extraParams", 9),
    ("StopCompleteRequest", "jobId", 1), ("StopCompleteRequest", "status", 2),
    ("StopCompleteRequest", "faultRanks", 3),
    ("RecoverStrategyRequest", "jobId", 1), ("RecoverStrategyRequest", "faultRanks", 2),
    ("RecoverStrategyRequest", "strategies", 3),
    ("RecoverStatusRequest", "jobId", 1), ("RecoverStatusRequest", "status", 2),
    ("RecoverStatusRequest", "strategy", 3), ("RecoverStatusRequest", "isolateRankIds", 4),
    ("ProcessFaultRequest", "jobId", 1), ("ProcessFaultRequest", "faultRanks", 2),
]


@pytest.mark.parametrize("message,field,number", CLUSTERD_FIELDS)
def test_clusterd_field_numbers(message: str, field: str, number: int) -> None:
    desc = recover_pb2.DESCRIPTOR.message_types_by_name[message]
    assert desc.fields_by_name[field].number == number


def test_no_package_and_method_paths() -> None:
    assert recover_pb2.DESCRIPTOR.package == ""
    service = recover_pb2.DESCRIPTOR.services_by_name["Recover"]
    assert sorted(m.name for m in service.methods) == sorted([
        "Init", "Register", "SubscribeProcessManageSignal", "ReportStopComplete",
        "ReportRecoverStrategy", "ReportRecoverStatus", "ReportProcessFault", "HealthCheck",
    ])
    assert service.methods_by_name["SubscribeProcessManageSignal"].server_streaming


def test_additions_use_numbers_from_100() -> None:
    known = {(m, f) for m, f, _ in CLUSTERD_FIELDS}
    for desc in recover_pb2.DESCRIPTOR.message_types_by_name.values():
        for f in desc.fields:
            if (desc.name, f.name) not in known:
                assert f.number >= 100, f"{desc.name}.{f.name} = {f.number} collides with ClusterD's range"


def test_own_services_in_own_package() -> None:
    assert taskd_pb2.DESCRIPTOR.package == "taskd.v1"
    assert "JobStatus" in taskd_pb2.DESCRIPTOR.services_by_name


def test_unknown_fields_survive_a_clusterd_peer() -> None:
    """A peer that only knows fields 1-99 still parses what we send."""
    info = recover_pb2.ClientInfo(jobId="j", role="agent", nodeRank=3, nodeCount=4)
    status_only = recover_pb2.Status.FromString(recover_pb2.Status(code=7, info="x").SerializeToString())
    assert status_only.code == 7
    parsed = recover_pb2.ClientInfo.FromString(info.SerializeToString())
    assert (parsed.jobId, parsed.nodeRank, parsed.nodeCount) == ("j", 3, 4)


def test_generated_code_is_current() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the [test] extra")
    from taskd.proto import generate

    assert generate.stale_files() == [], "run: python -m taskd.proto.generate"


def test_semantic_check_catches_a_changed_proto(tmp_path) -> None:
    """The check that runs with an unpinned grpcio-tools (e.g. beside MindSpore) still sees drift."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the [test] extra")
    from taskd.proto import generate

    assert generate.semantically_stale_files() == []
    for name in generate.PROTO_FILES:
        (tmp_path / name).write_text((generate.PROTO_DIR / name).read_text())
    recover = tmp_path / "recover.proto"
    recover.write_text(recover.read_text().replace("message Status {", "message Status {\n  string extra = 150;", 1))
    assert generate.semantically_stale_files(tmp_path) == ["recover_pb2.py"]
