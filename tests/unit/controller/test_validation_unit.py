"""The tests of tests/e2e/controller/test_validation.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: Every bad input gets its status code and an info naming
the problem; the server keeps serving.
"""

from __future__ import annotations

import pytest

from taskd.controller.config import ConfigError
from taskd.controller.service.server import ControllerConfig

BAD_CONFIGS = {
    # fields: words the problem must contain (the flag, and the field)
    "stop_timeout": ({"stop_timeout": 0}, "--stop-timeout must be > 0, got 0 (ControllerConfig.stop_timeout)"),
    "listen": ({"listen": "[::1"}, "--listen: bad listen address '[::1'"),
    "max_jobs": ({"max_jobs": 0}, "--max-jobs must be an integer > 0"),
    "settle_window": ({"settle_window": -1}, "--settle-window must be >= 0"),
    "max_restarts": ({"default_max_restarts": -1}, "--max-restarts must be an integer >= 0"),
    "max_node_count": ({"max_node_count": 0}, "--max-node-count must be an integer 1-"),
    "tls_key alone": ({"tls_key": "/nonexistent.pem"}, "--tls-cert: --tls-cert and --tls-key go together"),
    "token_file": ({"token_file": "/nonexistent/token"}, "--token-file or TASKD_TOKEN_FILE: cannot read the token"),
    "grace (programmatic)": ({"grace": -1}, "ControllerConfig.grace must be > 0"),
}


@pytest.mark.parametrize("fields,words", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_a_bad_config_is_refused_at_construction_naming_field_and_flag(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        ControllerConfig(**{"listen": "127.0.0.1:0", "state_path": ":memory:", **fields})
    assert words in str(err.value)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        ControllerConfig(stop_timeout=-1, recover_timeout=0, max_jobs=0)
    assert len(err.value.problems) == 3 and "--recover-timeout" in str(err.value)


def test_the_token_never_shows_in_the_config_repr() -> None:
    secret = "s3cr3t-" + "x" * 20
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=secret)
    assert secret not in repr(cfg) and secret not in str(cfg)
    with pytest.raises(ConfigError) as err:
        ControllerConfig(token="short one")
    assert "short one" not in str(err.value) and "fewer than 16" in str(err.value)


def test_max_ranks_is_checked_where_the_config_is_built() -> None:
    with pytest.raises(ConfigError) as err:
        ControllerConfig(max_ranks=0)
    assert "--max-ranks must be an integer 1-2147483647, got 0 (ControllerConfig.max_ranks)" in str(err.value)
