"""A node's ranksPerNode is checked against the job's on Init and Register (issue 31, F6): a node re-registering
with another count, or joining with one, is refused with the reason, and the job (its agents, their ranks) is
as it was; a ClusterD-wire job (no ranksPerNode in its Init) is held to its first node's count."""

from __future__ import annotations

from pathlib import Path

from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController


def controller(tmp_path: Path) -> EmbeddedController:
    return EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=str(tmp_path / "s.sqlite3"),
                                               keepalive_interval=0.3))


def agents_of(addr: str, job: str) -> dict[int, int]:
    return {a.nodeRank: a.ranksPerNode for a in ScriptedAgent(addr, "x").list_jobs(job).jobs[0].agents}


def test_a_node_re_registering_with_another_count_is_refused_and_claims_no_rank(tmp_path: Path) -> None:
    with controller(tmp_path) as ctl:
        addr = ctl.address
        nodes = [ScriptedAgent(addr, "j", n, 2, ranks_per_node=2).join() for n in range(2)]
        greedy = ScriptedAgent(addr, "j", 0, 2, ranks_per_node=1000)  # node 0's process, re-registering
        status = greedy.register()
        assert status.code == 409, status
        assert "node 0 says it runs 1000 rank(s) per node, but job j has 2 (its Init)" in status.info
        assert "--nproc-per-node 2" in status.info
        assert agents_of(addr, "j") == {0: 2, 1: 2}
        fault = nodes[0].fault({2: 1})  # rank 2 is node 1's: node 0 still may not report it
        assert fault.code == 402 and "is not one of node 0's ranks (0-1)" in fault.info, fault
        assert ScriptedAgent(addr, "x").list_jobs("j").jobs[0].state == "RUNNING"
        for a in (*nodes, greedy):
            a.close()


def test_a_node_started_with_another_count_is_refused_at_init_and_register(tmp_path: Path) -> None:
    with controller(tmp_path) as ctl:
        addr = ctl.address
        node0 = ScriptedAgent(addr, "j", 0, 2, ranks_per_node=2).join()
        node1 = ScriptedAgent(addr, "j", 1, 2, ranks_per_node=3, pid=777)
        init = node1.init()
        assert init.code == 409 and "node 1 says it runs 3 rank(s) per node, but job j has 2" in init.info, init
        register = node1.register()
        assert register.code == 409 and "node 1 says it runs 3" in register.info, register
        assert agents_of(addr, "j") == {0: 2}
        standby = ScriptedAgent(addr, "j", 0, 2, ranks_per_node=4, pid=778)
        standby.info.standby = True
        assert standby.register().code == 409
        for a in (node0, node1, standby):
            a.close()


def test_a_clusterd_wire_job_is_held_to_its_first_nodes_count(tmp_path: Path) -> None:
    with controller(tmp_path) as ctl:
        addr = ctl.address
        first = ScriptedAgent(addr, "c", 0, 2, ranks_per_node=0)
        assert first.init().code == 0
        first.info.ranksPerNode = 2
        assert first.register().code == 0
        second = ScriptedAgent(addr, "c", 1, 2, ranks_per_node=5)
        status = second.register()
        assert status.code == 409 and "but job c has 2 (node 0 registered with it)" in status.info, status
        silent = ScriptedAgent(addr, "c", 1, 2, ranks_per_node=0)  # says nothing: not refused
        assert silent.register().code == 0
        for a in (first, second, silent):
            a.close()
