"""How an agent of a multi-node job waits for the job's end (taskd/agent/link/job_status.py), against a real controller.

The controller is a real `taskd server` core in this process (EmbeddedController, loopback); the two
"nodes" are ControllerLinks registered for one job of two nodes, as the agents register. The wait
must end when the controller says the job ended, when the scheduler exits by itself, when the grace
runs out, and at once on a signal; msrun end to end is tests/e2e/framework/test_msrun_multinode.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from taskd.agent.config import AgentConfig
from taskd.agent.link.controller import ControllerLink
from taskd.agent.link.job_status import await_job_end
from taskd.agent.ranks.table import RankLayout
from taskd.controller.service.server import ControllerConfig, EmbeddedController


@pytest.fixture
def address() -> Iterator[str]:
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:"))
    try:
        yield ctl.start()
    finally:
        ctl.stop()


def node(address: str, job_id: str, rank: int) -> ControllerLink:
    link = ControllerLink(AgentConfig(launcher="msrun", server=address, controller_timeout=5.0), lambda: None)
    assert link.connect(job_id, RankLayout(node_rank=rank, node_count=2, global_ranks=(rank,)))
    return link


def test_the_wait_ends_when_the_last_node_finishes(address: str) -> None:
    links = [node(address, "two-nodes", r) for r in (0, 1)]
    try:
        links[0].reports.finished(0, "")
        assert links[0].job_state()[0] == "RUNNING"  # node 1 still runs: node 0 must keep waiting
        seen = []

        def sleep(seconds: float) -> None:  # node 1 finishes while node 0 waits
            seen.append(seconds)
            if len(seen) == 2:
                links[1].reports.finished(0, "")
            time.sleep(seconds)

        end = await_job_end(links[0], 30.0, lambda: True, lambda: False, sleep=sleep)
        assert (end.state, end.why, end.failed) == ("SUCCEEDED", "controller", False)
        assert len(seen) >= 2
    finally:
        for link in links:
            link.close(0, "")


def test_a_job_that_failed_on_another_node_fails_here_too(address: str) -> None:
    links = [node(address, "one-fails", r) for r in (0, 1)]
    try:
        links[0].reports.finished(0, "")
        links[1].reports.finished(3, "rank 1 exited with code 3")
        end = await_job_end(links[0], 30.0, None, lambda: False)
        assert end.failed and end.why == "controller"
        assert "node 1 finished with exit code 3" in end.info
    finally:
        for link in links:
            link.close(0, "")


def test_the_wait_is_bounded_and_ends_early_on_the_schedulers_exit_or_a_signal(address: str) -> None:
    links = [node(address, "never-ends", r) for r in (0, 1)]
    try:
        links[0].reports.finished(0, "")
        assert await_job_end(links[0], 0.5, None, lambda: False).why == "grace"
        end = await_job_end(links[0], 30.0, lambda: False, lambda: False)  # every rank left the scheduler
        assert (end.state, end.why) == ("RUNNING", "scheduler exited")
        assert await_job_end(links[0], 30.0, lambda: True, lambda: True).why == "signal"
    finally:
        for link in links:
            link.close(0, "")


def test_an_unreachable_controller_only_costs_the_grace() -> None:
    from taskd.launcher.spec import free_port

    link = ControllerLink(AgentConfig(launcher="msrun", server=f"127.0.0.1:{free_port()}", controller_timeout=0.5),
                          lambda: None)
    assert not link.connect("nobody", RankLayout(node_rank=0, node_count=2, global_ranks=(0,)))
    assert link.job_state() is None  # not registered: nothing to ask
    assert await_job_end(link, 0.3, None, lambda: False).state is None
