"""The tests of tests/e2e/client/test_taskd_api.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: TaskD's API as TaskD's users call it: one
DLRecoverManager per process, module functions that find it.
"""

from __future__ import annotations

import pytest
from support.client import (
    JOB,
    fresh_instance,  # noqa: F401 (an autouse fixture)
)

from taskd.proto import recover_pb2 as pb
from taskd.python.toolkit.recover_module import recover_manager as rm


def test_taskd_package_exports_dlrecovermanager_and_its_pb_path() -> None:
    """TaskD's tests write `from taskd.python.toolkit.recover_module import recover_manager, DLRecoverManager`
    and `from taskd.python.toolkit.recover_module.pb import recover_pb2 as pb` (and recover_pb2_grpc)."""
    from taskd.python.toolkit.recover_module import DLRecoverManager, recover_manager
    from taskd.python.toolkit.recover_module.pb import recover_pb2, recover_pb2_grpc

    assert DLRecoverManager is recover_manager.DLRecoverManager
    assert recover_pb2.ClientInfo is pb.ClientInfo and recover_pb2.ProcessFaultRequest is pb.ProcessFaultRequest
    assert recover_pb2.DESCRIPTOR is pb.DESCRIPTOR
    for name in ("RecoverStub", "RecoverServicer", "add_RecoverServicer_to_server"):
        assert hasattr(recover_pb2_grpc, name), name


def test_local_proxy_enable_on_talks_to_the_local_proxy(monkeypatch) -> None:
    """TaskD's test_init_clusterd_use_proxy: MINDX_SERVER_IP=localhost, LOCAL_PROXY_ENABLE=on ->
    server_addr '127.0.0.1:8899' (TaskD's GetClusterdAddr too: any MINDX_SERVER_IP)."""
    monkeypatch.setenv("MINDX_TASK_ID", JOB)
    monkeypatch.setenv("MINDX_SERVER_IP", "localhost")
    monkeypatch.setenv("LOCAL_PROXY_ENABLE", "on")
    assert rm.init_grpc_recover_manager().server_addr == "127.0.0.1:8899"
    monkeypatch.setenv("MINDX_SERVER_IP", "10.1.2.3:9000")
    assert rm.init_grpc_recover_manager().server_addr == "127.0.0.1:8899"
    for value in ("off", "ON", "1"):  # TaskD compares with "on" exactly
        monkeypatch.setenv("LOCAL_PROXY_ENABLE", value)
        assert rm.init_grpc_recover_manager().server_addr == "10.1.2.3:9000", value
    monkeypatch.setenv("LOCAL_PROXY_ENABLE", "on")
    monkeypatch.delenv("MINDX_SERVER_IP")
    with pytest.raises(rm.ConfigurationError, match="MINDX_SERVER_IP"):  # TaskD: ValueError, both required
        rm.init_grpc_recover_manager()


def test_local_proxy_enable_on_is_the_agent_controller_too(monkeypatch) -> None:
    from taskd.agent.config import AgentConfig

    monkeypatch.setenv("MINDX_SERVER_IP", "10.1.2.3:9000")
    monkeypatch.setenv("LOCAL_PROXY_ENABLE", "on")
    assert AgentConfig.from_env().server == "127.0.0.1:8899"
    assert AgentConfig.from_env(server="10.9.9.9:1").server == "10.9.9.9:1"  # a flag (taskd run --server) wins
    monkeypatch.delenv("MINDX_SERVER_IP")
    assert AgentConfig.from_env().server is None  # no MINDX_SERVER_IP: the embedded controller, as before
