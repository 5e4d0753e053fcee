"""A bad TASKD_* setting under msrun: the plugin still takes control, then start() fails with exit 2.

msrun builds `MSRunPlugin()` with no arguments and, should the constructor raise, logs a warning and
runs the job itself, unprotected (issue 13 item 5). So the constructor must not raise; `start()`
starts no rank, says which setting is wrong in one line and exits 2. Called here as msrun calls it.
"""

from __future__ import annotations

import logging

import pytest

from taskd.callbacks import CALLBACKS
from taskd.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin


class RecordingLauncher:
    """msrun's four callbacks, recording every call: a refused job must start nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def callback(self, name: str):  # noqa: ANN201 (a callback)
        def call(*args: object) -> object:
            self.calls.append(name)
            return {} if name == "MONITOR" else 0
        return call


@pytest.mark.parametrize("var,value,needle", [
    ("TASKD_MONITOR_INTERVAL", "0", "monitor_interval (TASKD_MONITOR_INTERVAL) must be > 0"),
    ("TASKD_MAX_RESTARTS", "many", "TASKD_MAX_RESTARTS"),
    ("TASKD_STRATEGIES", "recover,teleport", "teleport"),
    ("TASKD_SCHEDULER_GRACE", "-1", "scheduler_grace (TASKD_SCHEDULER_GRACE) must be >= 0"),
])
def test_bad_setting_takes_control_then_start_exits_2_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture,
                                                                var: str, value: str, needle: str) -> None:
    monkeypatch.setenv(var, value)
    plugin = MSRunPlugin()  # what msrun does; raising here would hand the job back to msrun, unprotected
    launcher = RecordingLauncher()
    for name in CALLBACKS:  # msrun registers all four; none may be refused either
        plugin.register_callbacks(name, launcher.callback(name))

    with caplog.at_level(logging.ERROR, logger="taskd"), pytest.raises(SystemExit) as exit_:
        plugin.start()

    assert exit_.value.code == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert needle in errors[0] and var in errors[0], errors
    assert launcher.calls == [], f"a refused job must start no rank, but called {launcher.calls}"
    assert plugin.result is not None and plugin.result.exit_code == 2 and not plugin.result.succeeded


def test_good_settings_still_build_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKD_SCHEDULER_GRACE", "12.5")
    plugin = MSRunPlugin()
    assert plugin.config_error is None
    assert plugin.config is not None and plugin.config.scheduler_grace == 12.5


def test_unknown_keyword_is_still_a_programming_error() -> None:
    with pytest.raises(TypeError, match="scheduler_grac"):
        MSRunPlugin(scheduler_grac=1)


def test_msrun_dump_wait_covers_the_collective_timeout_unless_set() -> None:
    """Issue 37 item 3: a survivor saves only once its collective fails, so the default wait covers it."""
    from taskd.agent.plugin import DUMP_SAVE_MARGIN, msrun_dump_timeout

    assert msrun_dump_timeout(30.0, {}) == 30.0 + DUMP_SAVE_MARGIN  # MindSpore CPU: 30 s unset
    assert msrun_dump_timeout(30.0, {"MS_CPU_COMM_OP_TIMEOUT": "10"}) == 30.0  # 10 + margin is under 30
    assert msrun_dump_timeout(30.0, {"HCCL_EXEC_TIMEOUT": "120"}) == 120.0 + DUMP_SAVE_MARGIN
    assert msrun_dump_timeout(20.0, {"TASKD_DUMP_TIMEOUT": "20"}) == 20.0  # set: as it is
