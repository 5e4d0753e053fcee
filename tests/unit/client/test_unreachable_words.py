"""How an unreachable controller is described (issue 31, F11): the set-up hints only for a connection that never
worked, or a TLS handshake; a controller that answered before and went away is said to be gone."""

from __future__ import annotations

from taskd.client.errors import ServerUnreachable

CLOSED = "Subscribe: UNAVAILABLE: Stream removed (Socket closed)"
REFUSED = "Init: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: Connection refused"


def test_a_controller_that_answered_before_is_said_to_be_gone() -> None:
    closed = str(ServerUnreachable("ctl:8899", CLOSED, known=True))
    assert closed == f"the controller at ctl:8899 closed the connection ({CLOSED})"
    refused = str(ServerUnreachable("ctl:8899", REFUSED, known=True))
    assert refused.startswith("the controller at ctl:8899 is unreachable (") and "taskd server" not in refused


def test_a_first_connection_and_a_handshake_keep_their_hints() -> None:
    assert "TASKD_TLS_CA" in str(ServerUnreachable("ctl:8899", CLOSED))
    assert "is `taskd server` running there?" in str(ServerUnreachable("ctl:8899", REFUSED))
    handshake = "Init: UNAVAILABLE: Ssl handshake failed: SSL_ERROR_SSL"
    assert "TASKD_TLS_CA" in str(ServerUnreachable("ctl:8899", handshake, known=True))
