"""A standby's client takes over a node over real gRPC (127.0.0.1, port 0): RecoverClient.register(adopt=True).

The controller ends the standby's stream as it takes the standby's Register as node R, and the client's
subscription then re-Inits and re-registers at once, possibly before that Register's answer is back. The
client kept its old identity until the answer came, so that re-register registered the process as a
standby again: the controller then listed node 1's agent as a spare too (it could be assigned another lost
node, and is told "job ended" as one). Seen here by holding the hand-over's answer back 1 s; in CI a
standby's node once never reported its recover status or finish (the job stayed RECOVERING after every node
exited 0), which this race can explain. The identity is now the client's before the Register is sent.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
from support import wait_until
from support.scripted_agent import ScriptedAgent

from taskd.client import RecoverClient, RecoverSignal
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2
from taskd.vocabulary import Code

FAST = {"keepalive_interval": 0.2, "agent_loss_timeout": 2.0, "agent_loss_grace": 0.3, "node_rejoin_timeout": 30}


@pytest.fixture
def controller():
    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", **FAST)) as ctl:
        yield ctl


def test_a_standby_keeps_its_new_node_when_its_stream_is_re_registered_before_the_hand_over_answers(controller):
    job = "takeover"
    node0 = ScriptedAgent(controller.address, job, node_rank=0, node_count=2, ranks_per_node=1, host="n0").join()
    node1 = ScriptedAgent(controller.address, job, node_rank=1, node_count=2, ranks_per_node=1, host="n1").join()
    info = recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=0, nodeCount=2, ranksPerNode=1, standby=True)
    spare = RecoverClient(info, controller.address, call_timeout=5.0, backoff_initial=0.05, backoff_max=0.5,
                          liveness_timeout=3.0)
    assigned: queue.Queue[RecoverSignal] = queue.Queue()
    spare.register_action_handler("taskd.assignNode", assigned.put)
    subscriber = threading.Thread(target=spare.start_subscribe, daemon=True)
    try:
        assert spare.init_clusterd() and spare.register().code == Code.OK
        subscriber.start()
        wait_until(lambda: spare.connected, what="the standby subscribed")
        node1.unsubscribe()  # node 1's agent is gone: the standby is assigned it
        assert assigned.get(timeout=10).node_ranks == [1]

        main = threading.current_thread()
        call = spare.rpc.call

        def slow_hand_over(method, request, **kw):  # noqa: ANN001, ANN202
            status = call(method, request, **kw)
            if method == "Register" and threading.current_thread() is main and request.nodeRank == 1:
                time.sleep(1.0)  # the stream ended meanwhile: the subscription re-registers before this returns
            return status

        spare.rpc.call = slow_hand_over
        took = recover_pb2.ClientInfo()
        took.CopyFrom(spare.info)
        took.nodeRank, took.standby = 1, False
        assert spare.register(took, adopt=True).code == Code.OK

        def node1_held() -> bool:
            (rec,) = node0.list_jobs(job).jobs
            held = [(a.nodeRank, a.pid, a.subscribed) for a in rec.agents if not a.standby and a.nodeRank == 1]
            return held == [(1, spare.info.pid, True)] and not [a for a in rec.agents if a.standby]

        wait_until(node1_held, what="node 1 held (and streamed) by the former standby, no standby listed")
        (rec,) = node0.list_jobs(job).jobs
        kinds = [e.kind for e in rec.events]
        after = kinds[kinds.index("node_replaced"):]
        assert "standby_registered" not in after and after.count("agent_registered") >= 2, after  # re-registered as 1
        assert spare.identity()["nodeRank"] == 1
        assert spare.report_finished(0, "done", timeout=5) == Code.OK
        (rec,) = node0.list_jobs(job).jobs
        assert [a.finished for a in rec.agents if a.nodeRank == 1] == [True], rec
    finally:
        spare.stop()
        subscriber.join(10)
        node0.close()
        node1.close()
