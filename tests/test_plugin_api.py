"""MSRunPlugin's surface as msrun uses it: no-argument constructor, callback registration, config."""

from __future__ import annotations

import pytest

from taskd.agent.config import AgentConfig
from taskd.framework.agent.ms_mgr.msrun_plugin import CALLBACKS, MSRunPlugin


def test_msrun_import_path_and_no_argument_constructor() -> None:
    from taskd.python.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin as Compat

    assert Compat is MSRunPlugin
    plugin = Compat()
    assert plugin.config.launcher == "msrun"
    assert plugin.config.offered_strategies == ["job-rescheduling", "exit"]


def test_unknown_operator_names_the_four() -> None:
    plugin = MSRunPlugin()
    with pytest.raises(ValueError) as err:
        plugin.register_callbacks("RESTART", lambda: 0)
    for name in CALLBACKS:
        assert name in str(err.value)


def test_non_callable_callback_rejected() -> None:
    with pytest.raises(TypeError, match="MONITOR"):
        MSRunPlugin().register_callbacks("MONITOR", 42)


def test_start_without_callbacks_names_the_missing_ones() -> None:
    plugin = MSRunPlugin()
    plugin.register_callbacks("MONITOR", lambda ranks: {})
    with pytest.raises(RuntimeError) as err:
        plugin.start()
    assert "KILL_WORKER" in str(err.value) and "START_ALL_WORKER" in str(err.value)
    assert "MONITOR" not in str(err.value)
    assert "before start()" in str(err.value)  # says what to do


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINDX_TASK_ID", "job-7")
    monkeypatch.setenv("MINDX_SERVER_IP", "10.0.0.1:9000")
    monkeypatch.setenv("TASKD_STRATEGIES", "recover,exit")
    monkeypatch.setenv("TASKD_MAX_RESTARTS", "5")
    cfg = AgentConfig.from_env()
    assert (cfg.job_id, cfg.server, cfg.max_restarts) == ("job-7", "10.0.0.1:9000", 5)
    assert cfg.offered_strategies == ["recover", "exit"]
    # keyword overrides (what taskd run passes) win over the environment
    assert AgentConfig.from_env(max_restarts=1, launcher="taskd").max_restarts == 1


@pytest.mark.parametrize("var,value,needle", [
    ("TASKD_STRATEGIES", "recover,teleport", "teleport"),
    ("TASKD_MAX_RESTARTS", "many", "TASKD_MAX_RESTARTS"),
    ("TASKD_MONITOR_INTERVAL", "-1", "monitor_interval"),
    ("TASKD_MONITOR_INTERVAL", "-1", "TASKD_MONITOR_INTERVAL"),  # a bad value names the variable to fix
    ("TASKD_MONITOR_INTERVAL", "0", "TASKD_MONITOR_INTERVAL"),  # refused, not silently turned into 1 s
    ("TASKD_MAX_RESTARTS", "-1", r"TASKD_MAX_RESTARTS\) must be >= 0"),
    ("TASKD_NNODES", "0", r"TASKD_NNODES\) must be >= 1"),
])
def test_bad_configuration_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                            needle: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=needle):
        AgentConfig.from_env()


def test_unknown_keyword_setting() -> None:
    with pytest.raises(TypeError, match="max_restart"):
        MSRunPlugin(max_restart=3)
