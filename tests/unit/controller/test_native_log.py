"""The rate limit on gRPC core's handshake-failure lines (native_log.py), on lines it is handed."""

from __future__ import annotations

from taskd.controller.service.native_log import NativeLogFilter


def test_handshake_failures_pass_once_per_interval_with_a_count_and_other_lines_always() -> None:
    now = [0.0]
    f = NativeLogFilter(interval=10.0, clock=lambda: now[0])
    line = b"E1201 ssl_transport_security.cc:1665] Handshake failed with fatal error SSL_ERROR_SSL\n"
    assert f.filter(line) == line
    assert [f.filter(line) for _ in range(5)] == [b""] * 5
    assert f.filter(b"2026 INFO taskd.controller: listening\n") == b"2026 INFO taskd.controller: listening\n"
    now[0] = 10.5
    assert f.filter(line).endswith(b"(5 more like it in the last 10s not shown)\n")
