"""The tests of tests/e2e/client/test_client.py that start no process and open no network socket (the
unit tier).

Split from it by move_tests.py; its subject: DLRecoverManager against a tiny real gRPC server on a
loopback port.
"""

from __future__ import annotations

import pytest
from support.client import JOB

from taskd.client import current as rm
from taskd.client.errors import ConfigurationError
from taskd.client.manager import DLRecoverManager
from taskd.client.retry import Backoff
from taskd.client.rpc import normalize_address
from taskd.proto import recover_pb2
from taskd.vocabulary import DEFAULT_PORT


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("10.0.0.5", f"10.0.0.5:{DEFAULT_PORT}"),
        ("10.0.0.5:9000", "10.0.0.5:9000"),
        (" ctrl.example ", f"ctrl.example:{DEFAULT_PORT}"),
        ("[::1]:9000", "[::1]:9000"),
        ("::1", f"[::1]:{DEFAULT_PORT}"),
        ("http://host:1234/", "host:1234"),
    ],
)
def test_normalize_address(given, expected):
    assert normalize_address(given) == expected


@pytest.mark.parametrize("bad", ["", "host:", "host:abc", "host:70000", "host:0", "[::1", ":80", "bad:host:1",
                                 "a b:1", "[10.0.0.1]:80"])
def test_normalize_address_rejects_bad_input(bad):
    with pytest.raises(ConfigurationError, match="address"):
        normalize_address(bad)


def test_backoff_grows_is_capped_and_jittered():
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.5)
    delays = [backoff.next_delay() for _ in range(20)]
    assert all(0.05 - 1e-9 <= d <= 1.0 for d in delays)
    assert max(delays[10:]) > 0.5  # reached the cap region
    assert len({round(d, 6) for d in delays[10:]}) > 1  # jittered, not a fixed value
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_compat_path_reexports_the_same_objects():
    from taskd.python.toolkit.recover_module import recover_manager as compat
    from taskd.toolkit.recover_module import recover_manager as old

    for name in old.__all__:
        assert getattr(compat, name) is getattr(old, name), name
    assert compat.DLRecoverManager is DLRecoverManager and compat.report_process_fault is rm.report_process_fault


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ConfigurationError, match="jobId"):
        DLRecoverManager(recover_pb2.ClientInfo(), "127.0.0.1")
    with pytest.raises(TypeError):
        DLRecoverManager({"jobId": "x"}, "127.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="address"):
        DLRecoverManager(recover_pb2.ClientInfo(jobId="x"), "host:port")
    manager = DLRecoverManager(recover_pb2.ClientInfo(jobId="x"), "127.0.0.1")
    assert manager.server_addr == f"127.0.0.1:{DEFAULT_PORT}"
    manager.stop()


def test_manager_from_env_reads_the_agents_layout_names_and_the_older_aliases():
    """The agent is configured with TASKD_NNODES / TASKD_NPROC_PER_NODE; a client in its ranks (which inherit that
    environment) reads the same names."""
    base = {"MINDX_TASK_ID": JOB, "MINDX_SERVER_IP": "127.0.0.1:1"}
    for env, want in (({"TASKD_NNODES": "4", "TASKD_NPROC_PER_NODE": "8", "TASKD_NODE_COUNT": "99",
                        "TASKD_RANKS_PER_NODE": "99"}, (4, 8)),
                      ({"TASKD_NODE_COUNT": "2", "TASKD_RANKS_PER_NODE": "3"}, (2, 3))):
        manager = rm.manager_from_env({**base, **env})
        try:
            assert (manager.client_info.nodeCount, manager.client_info.ranksPerNode) == want
        finally:
            manager.stop()
    with pytest.raises(ConfigurationError, match="TASKD_NNODES"):
        rm.manager_from_env({**base, "TASKD_NNODES": "two"})


def test_module_functions_without_env_raise_a_clear_error(monkeypatch, no_current_manager):
    monkeypatch.delenv("MINDX_TASK_ID", raising=False)
    monkeypatch.setenv("MINDX_SERVER_IP", "127.0.0.1")
    with pytest.raises(ConfigurationError, match="MINDX_TASK_ID is not set"):
        rm.report_process_fault({0: 1})
    monkeypatch.delenv("MINDX_SERVER_IP")
    with pytest.raises(ConfigurationError, match="MINDX_TASK_ID and MINDX_SERVER_IP are not set"):
        rm.get_manager()
    monkeypatch.setenv("MINDX_TASK_ID", JOB)
    monkeypatch.setenv("MINDX_SERVER_IP", "127.0.0.1:1")
    monkeypatch.setenv("TASKD_NODE_RANK", "first")
    with pytest.raises(ConfigurationError, match="TASKD_NODE_RANK"):
        rm.get_manager()


def test_recover_status_request_carries_rejoined_only_when_said() -> None:
    """The settle rule's input (docs/controller.md): a live rebuild says rejoined, a plain restart does not."""
    mgr = DLRecoverManager(recover_pb2.ClientInfo(jobId="x", role="agent"), "127.0.0.1:1")
    plain = mgr.recover_status_request(0, "", {1: 1}, "recover")
    live = mgr.recover_status_request(0, "", {1: 1}, "recover", rejoined=True)
    assert plain.rejoined is False and live.rejoined is True
    wire = recover_pb2.RecoverStatusRequest.FromString(live.SerializeToString())
    assert wire.rejoined and wire.strategy == "recover"
