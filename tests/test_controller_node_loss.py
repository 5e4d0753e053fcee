"""Issue 17 over real gRPC (127.0.0.1, port 0, fake agents built from the real client and raw stubs): a node
that finished while the controller was down is finished, not lost; a lost node is survived."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scripted_agent import ScriptedAgent

from taskd.client import RecoverClient
from taskd.client.credentials import ClientCredentials
from taskd.controller.server import ControllerConfig, EmbeddedController
from taskd.launcher.spec import free_port
from taskd.proto import recover_pb2

LOSS = 2.0
_ids = itertools.count()


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def record(agent: ScriptedAgent):  # noqa: ANN201
    jobs = agent.list_jobs(agent.job_id)
    assert jobs.status.code == 0, jobs.status.info
    return jobs.jobs[0]


def test_a_node_that_finished_while_the_controller_was_down_is_finished_not_lost(tmp_path: Path) -> None:
    """N1: node 0 ends while the controller is down; its ReportFinished is re-sent until the restarted
    controller acknowledges it, and the controller counts the node finished: node 1 runs on, past the loss
    timeout, and the job succeeds when it ends."""
    state, port = tmp_path / "ctl.sqlite3", free_port()
    cfg = ControllerConfig(listen=f"127.0.0.1:{port}", state_path=str(state), keepalive_interval=0.3,
                           agent_loss_timeout=LOSS)
    ctl = EmbeddedController(cfg)
    address = ctl.start()
    job = f"n1-{next(_ids)}"
    info = recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=0, nodeCount=2, ranksPerNode=1)
    # each call waits at most 1 s (wait_for_ready): the outage below outlasts one call, not the report's budget
    node0 = RecoverClient(info, address, credentials=ClientCredentials(), call_timeout=1.0)
    stream0 = ScriptedAgent(address, job, node_rank=0, node_count=2, host=socket.gethostname(), pid=os.getpid())
    node1 = ScriptedAgent(address, job, node_rank=1, node_count=2)
    second: EmbeddedController | None = None
    try:
        stream0.join()
        assert node0.register().code == 0  # the same process as stream0's agent: a re-register
        node1.join()
        ctl.stop()  # the controller goes down (its state is on disk) ...
        answers: list[object] = []

        def finish() -> None:
            try:
                answers.append(node0.report_finished(0, "", timeout=30))
            except Exception as exc:  # noqa: BLE001 - the test reports what came back
                answers.append(exc)

        sender = threading.Thread(target=finish, daemon=True)
        sender.start()  # ... while node 0's ranks have all ended
        sender.join(2.5)
        assert sender.is_alive(), f"ReportFinished gave up while the controller was down: {answers}"
        second = EmbeddedController(cfg)
        second.start()
        sender.join(30)
        assert answers == [0], answers
        node1.join()  # node 1's agent resubscribes; node 0's never will: it has ended
        node1.no_signal(LOSS + 1.5)  # past the loss timeout: node 0 is finished, not lost
        rec = record(node1)
        assert rec.state == "RUNNING", rec.info
        (a0,) = [a for a in rec.agents if a.nodeRank == 0]
        assert a0.finished and a0.exitCode == 0
        assert node1.finished(0).code == 0
        assert record(node1).state == "SUCCEEDED"
    finally:
        node0.stop()
        stream0.close()
        node1.close()
        if second is not None:
            second.stop()
        ctl.stop()
