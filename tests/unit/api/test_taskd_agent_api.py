"""`taskd.api.taskd_agent_api`: TaskD's agent API as MindSpore 2.10's msrun calls it (no process started).

msrun's `RSCPluginHandle._register_by_agent` calls `init_taskd_agent({"Framework": "MindSpore"})`,
falls back to `MSRunPlugin` on False or on an exception, then `register_func(name, func)` four times.
"""

from __future__ import annotations

import logging

import pytest

import taskd.api.taskd_agent_api as api
from taskd.callbacks import CALLBACKS


@pytest.fixture(autouse=True)
def fresh_api(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(api, "_agent", None)
    monkeypatch.setattr(api, "_started", False)
    for var in ("MS_NODE_RANK", "MINDX_SERVER_IP", "TASKD_MAX_RESTARTS"):
        monkeypatch.delenv(var, raising=False)


def test_msrun_import_line_resolves() -> None:
    from taskd.api.taskd_agent_api import init_taskd_agent, register_func, start_taskd_agent  # msrun's line

    assert callable(init_taskd_agent) and callable(register_func) and callable(start_taskd_agent)


def test_mindspore_config_as_msrun_passes_it_builds_taskd_agent() -> None:
    assert api.init_taskd_agent({"Framework": "MindSpore"}) is True
    assert api._agent is not None and api._agent.config.launcher == "msrun"
    assert api._agent.config.node_rank is None  # msrun's --node_rank decides, as with MSRunPlugin
    assert api._agent.config.server is None  # embedded controller
    for name in CALLBACKS:
        assert api.register_func(name, lambda *a: 0) is True
    assert sorted(api._agent._callbacks) == sorted(CALLBACKS)


@pytest.mark.parametrize(("config", "reason"), [
    ({}, "Framework must be one of MindSpore, PyTorch, not None"),
    ({"Framework": "mindspore"}, "not 'mindspore'"),
    ({"Framework": "PyTorch"}, "taskd run"),
    ("MindSpore", "config must be a dict"),
    ({"Framework": "MindSpore", "ServerRank": "one"}, "ServerRank must be a non-negative integer, not 'one'"),
    ({"Framework": "MindSpore", "ServerRank": "-1"}, "ServerRank must be a non-negative integer"),
    ({"Framework": "MindSpore", "UpstreamAddr": "10.0.0.5", "UpstreamPort": "99x"}, "UpstreamPort must be"),
    ({"Framework": "MindSpore", "UpstreamPort": "9602"}, "without UpstreamAddr"),
    ({"Framework": "MindSpore", "UpstreamAddr": "bad host!"}, "not a host name or IP address"),
    ({"Framework": "MindSpore", "UpstreamAddr": "10.0.0.5", "UpstreamPort": "70000"}, "not 1-65535"),
])
def test_bad_config_returns_false_with_the_reason_logged(config, reason, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="taskd"):
        assert api.init_taskd_agent(config) is False
    assert reason in caplog.text, caplog.text
    assert api._agent is None


def test_cls_with_mindspore_is_refused(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="taskd"):
        assert api.init_taskd_agent({"Framework": "MindSpore"}, cls=object()) is False
    assert "cls" in caplog.text


def test_ms_node_rank_is_the_default_server_rank_as_in_taskd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MS_NODE_RANK", "2")
    assert api.init_taskd_agent({"Framework": "MindSpore"})
    assert api._agent.config.node_rank == 2
    assert api.init_taskd_agent({"Framework": "MindSpore", "ServerRank": "1"})  # the key wins
    assert api._agent.config.node_rank == 1
    monkeypatch.setenv("MS_NODE_RANK", "x")
    assert api.init_taskd_agent({"Framework": "MindSpore"}) is False


def test_upstream_names_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINDX_SERVER_IP", "10.9.9.9:1234")
    assert api.init_taskd_agent({"Framework": "MindSpore", "UpstreamAddr": "10.0.0.5", "UpstreamPort": "9000"})
    assert api._agent.config.server == "10.0.0.5:9000"
    assert api.init_taskd_agent({"Framework": "MindSpore", "UpstreamAddr": "::1"})
    assert api._agent.config.server == "[::1]:8899"
    assert api.init_taskd_agent({"Framework": "MindSpore"})
    assert api._agent.config.server == "10.9.9.9:1234"  # without the keys, MINDX_SERVER_IP as before


def test_unknown_config_keys_are_ignored_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="taskd"):
        assert api.init_taskd_agent({"Framework": "MindSpore", "ListenPort": "9602"}) is True
    assert "ListenPort" in caplog.text


def test_register_and_start_before_init_say_so(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="taskd"):
        assert api.register_func("MONITOR", lambda ranks: {}) is False
        assert api.start_taskd_agent() is None
    assert caplog.text.count("init_taskd_agent() was not called") == 2


def test_bad_setting_in_the_environment_still_takes_control(monkeypatch: pytest.MonkeyPatch) -> None:
    """As with MSRunPlugin: a bad TASKD_* value must not hand the job back to msrun, unprotected;
    the agent takes control and start fails with exit 2 naming it (tests/e2e/framework/test_msrun.py)."""
    monkeypatch.setenv("TASKD_MAX_RESTARTS", "many")
    assert api.init_taskd_agent({"Framework": "MindSpore"}) is True
    assert "TASKD_MAX_RESTARTS" in api._agent.config_error
