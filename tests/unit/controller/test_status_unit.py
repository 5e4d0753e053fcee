"""The tests of tests/e2e/controller/test_status.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: `taskd status` against a real controller holding a
recovered fault.
"""

from __future__ import annotations

from taskd.controller.status_view import normalize_address, render_text


def test_normalize_address() -> None:
    assert normalize_address("10.0.0.1") == "10.0.0.1:8899"
    assert normalize_address("10.0.0.1:9000") == "10.0.0.1:9000"
    assert normalize_address("::1") == "[::1]:8899"
    assert normalize_address("[::1]:7") == "[::1]:7"


def test_render_empty_and_error() -> None:
    from taskd.proto import recover_pb2, taskd_pb2

    assert render_text(taskd_pb2.JobList()) == "no jobs\n"
    err = taskd_pb2.JobList(status=recover_pb2.Status(code=402, info="job x does not exist"))
    assert render_text(err).startswith("error 402")
