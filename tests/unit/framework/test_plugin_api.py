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


def test_unknown_operator_is_ignored_with_a_warning_as_taskd_accepts_it(caplog) -> None:
    """TaskD's register_callbacks stores any name; raising would make msrun run the job unprotected."""
    plugin = MSRunPlugin()
    with caplog.at_level("WARNING", logger="taskd"):
        plugin.register_callbacks("RESTART", lambda: 0)
    assert "RESTART" in caplog.text and all(name in caplog.text for name in CALLBACKS)
    assert "RESTART" not in plugin._callbacks


@pytest.mark.parametrize("bad", [None, 42])
def test_none_or_non_callable_callback_is_refused_at_start_not_at_registration(bad) -> None:
    """TaskD's test_start_fail_when_some_func_not_register: register_callbacks(name, None) passes,
    start() raises."""
    plugin = MSRunPlugin()
    for name in CALLBACKS:
        plugin.register_callbacks(name, lambda *a: 0)
    plugin.register_callbacks("START_WORKER_LIST", bad)  # accepted here
    with pytest.raises(RuntimeError, match=r"START_WORKER_LIST \((NoneType|int)\)"):
        plugin.start()


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
