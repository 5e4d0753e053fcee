"""A Register the controller keeps refusing with the same answer is logged once as a warning (real gRPC, port 0).

An agent whose node rank another live agent holds asks again twice a second while it waits for that agent
to be declared lost (agent/link/registration.py); each refusal logged at WARNING made ~120 lines a minute.
"""

from __future__ import annotations

import logging

import pytest
from support.scripted_agent import ScriptedAgent

from taskd.client import RecoverClient
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.proto import recover_pb2


@pytest.fixture
def controller():
    with EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:")) as ctl:
        yield ctl


def test_the_same_refusal_again_is_logged_at_debug_and_a_new_one_warns_again(controller, caplog) -> None:
    job = "held"
    holder = ScriptedAgent(controller.address, job, node_rank=0, node_count=2, ranks_per_node=1, host="n0").join()
    info = recover_pb2.ClientInfo(jobId=job, role="agent", nodeRank=0, nodeCount=2, ranksPerNode=1)
    client = RecoverClient(info, controller.address, call_timeout=5.0)
    try:
        assert client.init_clusterd()
        caplog.set_level(logging.DEBUG, logger="taskd.client.manager")
        codes = [client.register().code for _ in range(3)]
        assert codes == [409] * 3  # held by a live agent
        said = [(r.levelno, r.getMessage()) for r in caplog.records if "of job held answered" in r.getMessage()]
        assert [level for level, _ in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG], said
        assert len({text for _, text in said}) == 1  # the same answer each time
        other = recover_pb2.ClientInfo()
        other.CopyFrom(info)
        other.nodeRank = 5  # out of range: another refusal, so a warning again
        caplog.clear()
        assert "out of range" in client.register(other).info  # another answer (409 too)
        assert [r.levelno for r in caplog.records if "answered" in r.getMessage()] == [logging.WARNING]
    finally:
        client.stop()
        holder.close()
