"""A multi-node job waits for all its nodes, bounded by a join timeout (torchrun's rendezvous join_timeout).

The controller's rule with a controlled clock (JobMachine), then over real gRPC (an EmbeddedController and
ScriptedAgents); the agent's wait (taskd/agent/link/job_status.py) against a real controller; and real `taskd run`
processes: a node whose peer never comes exits 1 naming it with no rank started, a node whose peer comes
late starts its ranks only then, a one-node job never asks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port, wait_for
from support.run import ROOT, taskd_run
from support.scripted_agent import ScriptedAgent

from taskd.agent.config import AgentConfig
from taskd.agent.link.controller import ControllerLink
from taskd.agent.link.job_status import await_nodes
from taskd.agent.ranks.table import RankLayout
from taskd.controller.config import ControllerConfig
from taskd.controller.service.server import EmbeddedController

# ------------------------------------------------------------------ the rule, clock passed in


# ------------------------------------------------------------------ over real gRPC


@pytest.fixture(scope="module")
def controller() -> Iterator[EmbeddedController]:
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", keepalive_interval=0.2,
                                              join_timeout=1.5))
    with ctl:
        yield ctl


def test_real_grpc_registered_agent_is_told_to_exit_when_a_node_never_joins(controller: EmbeddedController) -> None:
    node1 = ScriptedAgent(controller.address, "grpc-lone", node_rank=1, node_count=2).join()
    try:
        signal = node1.expect("changeStrategy", "exit", timeout=30)
        assert "never joined" in signal.extraParams
        (job,) = node1.list_jobs("grpc-lone").jobs
        assert job.state == "FAILED" and job.info == "node(s) [0] never joined within 1.5 s"
        assert "join_timeout" in [e.kind for e in job.events]
    finally:
        node1.close()


def link(address: str, job_id: str, node: int, nodes: int = 2) -> ControllerLink:
    lk = ControllerLink(AgentConfig(launcher="taskd", server=address, controller_timeout=5.0), lambda: None)
    assert lk.connect(job_id, RankLayout(node_rank=node, node_count=nodes, global_ranks=(node,)))
    return lk


def test_agent_wait_ends_when_the_last_node_registers(controller: EmbeddedController) -> None:
    first = link(controller.address, "wait-join", 1)
    late: list[ControllerLink] = []
    try:
        joiner = threading.Timer(0.3, lambda: late.append(link(controller.address, "wait-join", 0)))
        joiner.start()
        join = await_nodes(first, first.job_id, 2, 30.0, lambda: False)
        joiner.join(30)
        assert join.why == "joined" and join.may_start and join.joined == frozenset({0, 1})
    finally:
        for lk in (first, *late):
            lk.close(0, "")


def test_agent_wait_gives_up_at_its_timeout_or_on_a_signal_naming_the_missing_node(
        controller: EmbeddedController) -> None:
    lk = link(controller.address, "wait-timeout", 1, nodes=3)
    try:
        join = await_nodes(lk, lk.job_id, 3, 0.3, lambda: False)
        assert join.why == "timeout" and not join.may_start and join.missing == [0, 2]
        assert join.problem() == "node(s) [0, 2] of job wait-timeout did not join within 0.3s (1/3 joined)"
        assert await_nodes(lk, lk.job_id, 3, 30.0, lambda: True).why == "signal"
    finally:
        lk.close(0, "")


# ------------------------------------------------------------------ taskd run end to end


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, list[int]]]:
    """A real controller in this process; the list counts the JobStatus queries it answered."""
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=":memory:"))
    ctl.start()
    core = ctl.server.core
    queries: list[int] = []
    job_list = core.job_list

    def counted(job_id: str = ""):  # noqa: ANN202 - the real method, counted
        queries.append(1)
        return job_list(job_id)

    core.job_list = counted
    try:
        yield ctl.address, queries
    finally:
        ctl.stop()


MARK = '''import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "rank%s-%d" % (os.environ["RANK"], time.time_ns())).touch()
'''


def test_lone_node_waits_then_exits_1_naming_the_missing_node_with_no_rank_started(
        tmp_path: Path, server: tuple[str, list[int]]) -> None:
    address, _ = server
    script, marks = tmp_path / "mark.py", tmp_path / "marks"
    script.write_text(MARK)
    marks.mkdir()
    console = tmp_path / "node1.log"
    proc = taskd_run(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--job-id", "lone",
                      "--server", address, "--rdzv-conf", "join_timeout=2", str(script), str(marks)], console)
    rc = proc.wait(timeout=90)
    text = console.read_text()
    assert rc == 1, text
    assert "waiting for nodes [0] of job lone to join (1/2 joined)" in text
    assert "node(s) [0] of job lone did not join within 2s (1/2 joined): no rank started" in text
    assert list(marks.iterdir()) == [], "a rank started although node 0 never joined"


def test_node_waits_for_a_late_peer_then_both_run(tmp_path: Path, server: tuple[str, list[int]]) -> None:
    address, queries = server
    script, marks = tmp_path / "mark.py", tmp_path / "marks"
    script.write_text(MARK)
    marks.mkdir()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--job-id", "late", "--server", address,
              "--master-port", str(free_port())]
    first = taskd_run([*common, "--node-rank", "1", str(script), str(marks)], tmp_path / "node1.log")
    wait_for(lambda: "waiting for nodes [0]" in (tmp_path / "node1.log").read_text(), 60, "node 1 to wait")
    assert list(marks.iterdir()) == [], "node 1 started a rank before node 0 joined"
    second = taskd_run([*common, "--node-rank", "0", str(script), str(marks)], tmp_path / "node0.log",
                       env={"TASKD_JOIN_TIMEOUT": "120"})
    for name, proc in (("node1", first), ("node0", second)):
        assert proc.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()
    assert "all 2 nodes of job late joined after" in (tmp_path / "node1.log").read_text()
    assert sorted(p.name.split("-")[0] for p in marks.iterdir()) == ["rank0", "rank1"]
    assert queries, "the multi-node agents asked the controller who joined"


def test_single_node_job_never_asks_who_joined(tmp_path: Path, server: tuple[str, list[int]]) -> None:
    address, queries = server
    script, marks = tmp_path / "mark.py", tmp_path / "marks"
    script.write_text(MARK)
    marks.mkdir()
    proc = taskd_run(["--nproc-per-node", "2", "--job-id", "one", "--server", address, str(script), str(marks)],
                     tmp_path / "console.log")
    assert proc.wait(timeout=90) == 0, (tmp_path / "console.log").read_text()
    assert len(list(marks.iterdir())) == 2
    assert queries == [], "a one-node job asked the controller for the job's nodes (an extra round trip)"


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--rdzv-conf", "join_timeout=soon"], {}, "--rdzv-conf join_timeout: 'soon' is not a number"),
    (["--rdzv-conf", "join_timeout=0"], {}, "--rdzv-conf join_timeout must be > 0, not 0.0"),
    ([], {"TASKD_JOIN_TIMEOUT": "-1"}, "join_timeout (TASKD_JOIN_TIMEOUT) must be > 0, not -1.0"),
], ids=["flag-not-a-number", "flag-zero", "env-negative"])
def test_a_bad_join_timeout_is_a_usage_error_naming_where_it_came_from(
        tmp_path: Path, args: list[str], env: dict[str, str], needle: str) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit(3)\n")
    out = subprocess.run([sys.executable, "-m", "taskd.run", "--nnodes", "2", "--server", "127.0.0.1:9", *args,
                          str(script)], capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **env})
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr, out.stderr
