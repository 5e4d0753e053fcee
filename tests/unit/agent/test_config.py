"""AgentConfig checks itself when built: each bad field is named, with the variable or flag it came from."""

from __future__ import annotations

import pytest

from taskd.agent.config import AgentConfig


@pytest.mark.parametrize("field,value,needle", [
    ("max_restarts", -1, "max_restarts must be >= 0 and <= 10000, not -1"),
    ("monitor_interval", 0, "monitor_interval must be > 0"),
    ("stop_grace", -1.0, "stop_grace must be >= 0"),
    ("controller_timeout", -5, "controller_timeout must be >= 0"),
    ("dump_timeout", 0, "dump_timeout must be > 0"),
    ("heartbeat_timeout", -1, "heartbeat_timeout must be > 0"),
    ("node_count", 0, "node_count must be >= 1"),
    ("ranks_per_node", "2", "ranks_per_node must be an integer"),
    ("strategies", ["recover", "teleport"], "strategies: unknown strategy 'teleport'"),
    ("launcher", "slurm", "launcher must be one of"),
])
def test_construction_refuses_a_bad_field(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        AgentConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("var,value,needle", [
    ("TASKD_STOP_GRACE", "-2", r"stop_grace \(TASKD_STOP_GRACE\) must be >= 0"),
    ("TASKD_CONTROLLER_TIMEOUT", "soon", r"controller_timeout: TASKD_CONTROLLER_TIMEOUT='soon' is not a number"),
    ("TASKD_HEARTBEAT_TIMEOUT", "0", r"heartbeat_timeout \(TASKD_HEARTBEAT_TIMEOUT\) must be > 0"),
    ("TASKD_STRATEGIES", "exit,teleport", r"strategies \(TASKD_STRATEGIES\): unknown strategy 'teleport'"),
])
def test_a_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch, var: str, value: str, needle: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=needle):
        AgentConfig.from_env()


def test_a_bad_flag_is_named_and_an_override_is_not_blamed_on_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKD_MAX_RESTARTS", "2")
    with pytest.raises(ValueError, match=r"max_restarts \(--max-restarts\) must be >= 0 and <= 10000, not -1"):
        AgentConfig.from_env({"max_restarts": "--max-restarts"}, max_restarts=-1)
    with pytest.raises(ValueError, match=r"^max_restarts must be >= 0 and <= 10000, not -1$"):
        AgentConfig.from_env(max_restarts=-1)


def test_replace_checks_again() -> None:
    import dataclasses

    cfg = AgentConfig.from_env(launcher="taskd")
    with pytest.raises(ValueError, match="dump_timeout"):
        dataclasses.replace(cfg, dump_timeout=-1)


def test_a_flag_overrides_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """`taskd run --nnodes 2` with a stale TASKD_NNODES=two in the shell: the flag decides, nothing to refuse."""
    monkeypatch.setenv("TASKD_NNODES", "two")
    config = AgentConfig.from_env({"node_count": "--nnodes"}, node_count=2)
    assert config.node_count == 2
    with pytest.raises(ValueError, match="TASKD_NNODES"):
        AgentConfig.from_env()
