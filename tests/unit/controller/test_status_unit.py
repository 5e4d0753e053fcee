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


def test_a_node_loss_round_shows_the_node_its_old_and_new_host_and_how_long_from_the_loss() -> None:
    from taskd.proto import taskd_pb2

    loss = taskd_pb2.NodeLossRecord(nodeRank=1, oldHost="a", oldPid=11, lostAt=1000.0, newHost="b", newPid=22,
                                    replacedAt=1003.0, secondsToRoundEnd=4.25)
    job = taskd_pb2.JobRecord(
        jobId="j", state="RUNNING", rounds=[taskd_pb2.RoundRecord(round=1, startedAt=1000.0, endedAt=1004.25,
                                                                  outcome="recovered", nodeLosses=[loss])],
        events=[taskd_pb2.EventRecord(time=1000.0, kind="node_lost", round=1,
                                      detail='{"node_rank": 1, "host": "a", "pid": 11, "seconds": 2.004}')])
    text = render_text(taskd_pb2.JobList(jobs=[job]))
    assert "round 1: node 1 lost (agent a:11) at " in text and "replaced by b:22 at " in text, text
    assert "lost -> round ended 4.250s" in text, text
    assert "without a signal stream for 2.004s when declared lost" in text, text
