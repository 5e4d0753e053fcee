"""Settings msrun users can only give through the environment (issue 18: TASKD_DUMP_TIMEOUT under msrun)."""

from __future__ import annotations

import pytest

from taskd.agent.config import AgentConfig
from taskd.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin


def test_dump_timeout_is_read_from_the_environment_under_msrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKD_DUMP_TIMEOUT", "90")
    assert MSRunPlugin().config.dump_timeout == 90.0  # what msrun builds: no arguments
    assert AgentConfig.from_env(dump_timeout=5.0).dump_timeout == 5.0  # taskd run's --dump-timeout wins
    monkeypatch.delenv("TASKD_DUMP_TIMEOUT")
    assert MSRunPlugin().config.dump_timeout == 30.0


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_bad_dump_timeout_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TASKD_DUMP_TIMEOUT", value)
    with pytest.raises(ValueError, match="TASKD_DUMP_TIMEOUT"):
        AgentConfig.from_env()
    assert "TASKD_DUMP_TIMEOUT" in MSRunPlugin().config_error  # msrun: control taken, start() exits 2 naming it
