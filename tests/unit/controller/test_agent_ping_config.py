"""The server's PINGs that find a SIGSTOPped agent, and the standby bound: validated where they are built."""

from __future__ import annotations

import pytest

from taskd.controller.config import ConfigError, ControllerConfig


def test_the_ping_settings_reach_grpc_with_the_ping_timeout_grpc_really_applies() -> None:
    opts = dict(ControllerConfig(agent_ping_interval=1.5, agent_ping_timeout=2).grpc_options())
    assert opts["grpc.keepalive_time_ms"] == 1500 and opts["grpc.keepalive_timeout_ms"] == 2000
    # grpcio 1.85 times an unanswered PING out after http2.ping_timeout_ms (60 s by default), whatever
    # keepalive_timeout_ms says: without it a SIGSTOPped agent's stream stayed open ~80 s (measured)
    assert opts["grpc.http2.ping_timeout_ms"] == 2000


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("agent_ping_interval", 0, "--agent-ping-interval must be > 0"),
    ("agent_ping_timeout", -1.0, "--agent-ping-timeout must be > 0"),
    ("max_standbys", -1, "--max-standbys must be an integer >= 0"),
    ("max_standbys", 1.5, "--max-standbys must be an integer >= 0"),
])
def test_bad_values_are_refused_naming_the_flag(field: str, value: object, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        ControllerConfig(**{field: value})
