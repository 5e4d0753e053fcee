"""The tests of tests/e2e/controller/test_tls.py that start no process and open no network socket (the
unit tier).

Split from it by move_tests.py; its subject: TLS and mTLS with gRPC's own credentials; the
certificates are made here, for 127.0.0.1.
"""

from __future__ import annotations

import pytest

from taskd.controller.config import ConfigError
from taskd.controller.service.server import ControllerConfig


def test_an_open_address_needs_a_token_or_client_certificates(pki) -> None:
    tls = {"tls_cert": pki["server_cert"], "tls_key": pki["server_key"]}
    with pytest.raises(ConfigError, match="no token is set"):
        ControllerConfig(listen="0.0.0.0:0", state_path=":memory:", **tls)  # TLS alone proves nobody's identity
    ControllerConfig(listen="0.0.0.0:0", state_path=":memory:", tls_client_ca=pki["ca"], **tls)
    with pytest.raises(ConfigError, match="--tls-client-ca: requiring client certificates needs TLS"):
        ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", tls_client_ca=pki["ca"])
