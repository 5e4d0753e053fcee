"""Each node has one agent (issue 11, item 4): a live agent is not replaced by another (host, pid).

Live: its signal stream is open, or it registered and is not yet lost. The same (host, pid) is the same
agent reconnecting. An agent whose stream closed, or that was declared lost, can be taken over. Clients
that send no host and pid (TaskD's ClientInfo has no fields 100+) are all ("", 0), so they are one agent.
"""

from __future__ import annotations

import queue
from pathlib import Path

import grpc
import pytest
from support import wait_for
from support.scripted_agent import ScriptedAgent, StreamEnded

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.vocabulary import Code


def ok(status) -> None:  # noqa: ANN001
    assert status.code == 0, f"{status.code}: {status.info}"


@pytest.fixture
def ctl(tmp_path: Path):  # noqa: ANN201
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=str(tmp_path / "ctl.sqlite3"), keepalive_interval=0.3,
                           agent_loss_timeout=0.5)
    with EmbeddedController(cfg) as running:
        yield running


def stream_refusal(agent: ScriptedAgent) -> StreamEnded:
    agent.subscribe()
    try:
        agent.next_signal(10)
    except StreamEnded as ended:
        return ended
    except queue.Empty:
        pass
    raise AssertionError("the subscription was not refused")


def agents_of(probe: ScriptedAgent, job_id: str) -> list[tuple[int, str, int, bool]]:
    return [(a.nodeRank, a.host, a.pid, a.subscribed) for a in probe.list_jobs(job_id).jobs[0].agents]


def test_a_live_agent_keeps_its_node_its_stream_and_its_signals(ctl: EmbeddedController) -> None:
    real = ScriptedAgent(ctl.address, "j", host="node-a", pid=111).join()
    other = ScriptedAgent(ctl.address, "j", host="node-b", pid=222)
    ok(other.init())  # Init only joins a job that has a live agent
    status = other.register()
    assert status.code == Code.INVALID_PARAMS == 409
    assert "live agent (host 'node-a', pid 111" in status.info and "'node-b', pid 222" in status.info
    ended = stream_refusal(other)
    assert ended.code == grpc.StatusCode.INVALID_ARGUMENT and ended.details.startswith("409: ")
    assert agents_of(real, "j") == [(0, "node-a", 111, True)]
    ok(real.fault({0: 1}))
    real.expect("stopTrain")  # the real agent still gets its signals
    for a in (real, other):
        a.close()


def test_a_registered_agent_without_its_stream_yet_keeps_its_node(ctl: EmbeddedController) -> None:
    real = ScriptedAgent(ctl.address, "j", host="node-a", pid=111)
    ok(real.init())
    ok(real.register())
    status = ScriptedAgent(ctl.address, "j", host="node-b", pid=222).register()
    assert status.code == Code.INVALID_PARAMS and "signal stream not open yet" in status.info
    real.subscribe()
    wait_for(lambda: agents_of(real, "j") == [(0, "node-a", 111, True)], what="the real agent's stream")
    real.close()


def test_the_same_process_reconnects(ctl: EmbeddedController) -> None:
    agent = ScriptedAgent(ctl.address, "j", host="node-a", pid=111).join()
    ok(agent.register())  # again, with its stream open
    agent.subscribe()  # a second stream replaces the first
    ok(agent.fault({0: 1}))
    agent.expect("stopTrain")
    agent.unsubscribe()
    ok(agent.init())
    ok(agent.register())
    agent.subscribe()
    agent.expect("stopTrain")  # the signal it still owes, re-sent on its new stream
    agent.close()


def test_a_node_whose_agent_was_declared_lost_is_taken_over(ctl: EmbeddedController) -> None:
    """Issue 17: a closed stream alone no longer frees the node; once the agent is declared lost (the grace,
    here the 0.5 s loss timeout) the node-loss round awaits a replacement, and the next Register takes it."""
    first = ScriptedAgent(ctl.address, "j", nodes := 0, 2, host="node-a", pid=111).join()
    peer = ScriptedAgent(ctl.address, "j", 1, 2, host="node-c", pid=333).join()
    first.close()  # its process died
    wait_for(lambda: not agents_of(peer, "j")[nodes][3], what="node 0's stream to close")
    wait_for(lambda: list(peer.list_jobs("j").jobs[0].rejoining) == [0], what="node 0 to be declared lost")
    second = ScriptedAgent(ctl.address, "j", 0, 2, host="node-b", pid=222).join()  # restarted elsewhere
    # join() returns once the stream is opened, not once the controller has read it: online follows
    wait_for(lambda: agents_of(peer, "j")[0] == (0, "node-b", 222, True), what="node-b to hold node 0, online")
    for a in (peer, second):
        a.close()


def test_a_lost_agent_is_taken_over(ctl: EmbeddedController) -> None:
    lost = ScriptedAgent(ctl.address, "j", host="node-a", pid=111)
    ok(lost.init())
    ok(lost.register())  # and never subscribes: lost after the loss timeout (0.5 s)
    wait_for(lambda: lost.list_jobs("j").jobs[0].state == "REJOINING", what="the agent to be declared lost")
    ok(ScriptedAgent(ctl.address, "j", host="node-b", pid=222).register())
    assert agents_of(lost, "j")[0][1:3] == ("node-b", 222)
    lost.close()


def anonymous(address: str, job_id: str) -> ScriptedAgent:
    """A client without fields 100+ host and pid, like TaskD's own."""
    agent = ScriptedAgent(address, job_id)
    agent.info.ClearField("host")
    agent.info.ClearField("pid")
    return agent


def test_clients_without_host_and_pid_are_one_agent(ctl: EmbeddedController) -> None:
    first = anonymous(ctl.address, "j").join()
    again = anonymous(ctl.address, "j")  # indistinguishable from the first: its reconnect
    ok(again.init())
    ok(again.register())
    again.subscribe()
    ok(again.fault({0: 1}))
    again.expect("stopTrain")
    status = ScriptedAgent(ctl.address, "j", host="node-b", pid=222).register()  # but a process that says who it is
    assert status.code == Code.INVALID_PARAMS and "host '', pid 0" in status.info
    named = ScriptedAgent(ctl.address, "k", host="node-a", pid=111).join()
    status = anonymous(ctl.address, "k").register()  # and the other way round
    assert status.code == Code.INVALID_PARAMS and "pid 111" in status.info
    for a in (first, again, named):
        a.close()


# ---------------------------------------------------------------------------- the rule, with a clock


