"""A Register refused because another agent holds the node rank (agent/link/registration.py): the agent yields to a
replacement at once (a standby then), asks again while the holder is the node's own agent, and gives up after
its wait (a duplicate); a controller without JobStatus is asked again as before."""

from __future__ import annotations

from types import SimpleNamespace

from taskd.agent.link.registration import HELD, held, register_held, replacement_holder
from taskd.proto import taskd_pb2
from taskd.vocabulary import Code

REFUSED = SimpleNamespace(code=Code.INVALID_PARAMS, info=f"node 1 of job j {HELD} (host 'a', pid 7: its signal "
                          "stream is open); a second agent from host 'c', pid 9 is refused")
OK = SimpleNamespace(code=Code.OK, info="registered")


def record(holder: tuple[str, int], *losses: tuple[int, str, int]) -> taskd_pb2.JobRecord:
    """Node 1 held by `holder`; node 0 by ("a", 6); a standby ("s", 8); `losses`: (node, new host, new pid)."""
    agents = [taskd_pb2.AgentRecord(nodeRank=0, host="a", pid=6),
              taskd_pb2.AgentRecord(nodeRank=1, host=holder[0], pid=holder[1]),
              taskd_pb2.AgentRecord(host="s", pid=8, standby=True)]
    rounds = [taskd_pb2.RoundRecord(round=1, nodeLosses=[
        taskd_pb2.NodeLossRecord(nodeRank=n, oldHost="a", oldPid=5, newHost=h, newPid=p) for n, h, p in losses])]
    return taskd_pb2.JobRecord(agents=agents, rounds=rounds)


def test_only_a_holder_a_node_loss_names_as_the_new_one_is_a_replacement() -> None:
    assert replacement_holder(record(("b", 7), (1, "b", 7)), 1) == "b:7"
    assert replacement_holder(record(("b", 7)), 1) is None  # the node's own agent: never lost
    assert replacement_holder(record(("b", 7), (1, "b", 70)), 1) is None  # another process replaced it once
    assert replacement_holder(record(("b", 7), (0, "b", 7)), 1) is None  # a loss of another node
    assert replacement_holder(record(("b", 7), (1, "", 0)), 1) is None  # a loss not replaced yet
    # the standby's node rank field means nothing: a standby never holds a node
    assert replacement_holder(record(("b", 7), (0, "s", 8)), 0) is None


def test_held_is_the_409_naming_a_live_holder_only() -> None:
    assert held(REFUSED) and not held(OK)
    assert not held(SimpleNamespace(code=Code.INVALID_PARAMS, info="nodeRank 4 out of range"))
    assert not held(SimpleNamespace(code=Code.FENCED, info=f"... {HELD} ..."))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(answers: list[SimpleNamespace], records: list[taskd_pb2.JobRecord | None], wait: float
        ) -> tuple[object, list[int], Clock]:
    clock, calls = Clock(), []

    def register() -> SimpleNamespace:
        calls.append(1)
        return answers[min(len(calls), len(answers)) - 1]

    def rec() -> taskd_pb2.JobRecord | None:
        return records[min(len(calls), len(records)) - 1]

    return register_held(register, rec, 1, wait, sleep=clock.sleep, clock=clock), calls, clock


def test_a_node_a_replacement_holds_is_yielded_at_once() -> None:
    reg, calls, clock = run([REFUSED], [record(("b", 7), (1, "b", 7))], wait=60)
    assert reg.taken_by == "b:7" and reg.status is REFUSED and len(calls) == 1 and clock.now == 0


def test_a_holder_whose_loss_is_pending_is_waited_for_and_a_standby_taking_the_node_meanwhile_is_yielded_to() -> None:
    reg, calls, _ = run([REFUSED, REFUSED, OK], [record(("a", 7))], wait=60)
    assert reg.status is OK and reg.taken_by is None and len(calls) == 3  # the old agent was declared lost: ours
    reg, calls, _ = run([REFUSED, REFUSED, REFUSED], [record(("a", 7)), record(("a", 7)),
                                                      record(("s", 8), (1, "s", 8))], wait=60)
    assert reg.taken_by == "s:8" and len(calls) == 3  # the standby took it during the wait


def test_a_duplicate_is_refused_once_its_wait_is_over_and_without_jobstatus_too() -> None:
    reg, calls, clock = run([REFUSED], [record(("a", 7))], wait=4)
    assert reg.status is REFUSED and reg.taken_by is None and clock.now == 4 and len(calls) == 9
    reg, calls, clock = run([REFUSED], [None], wait=2)  # ClusterD: no record to read
    assert reg.taken_by is None and clock.now == 2
    reg, calls, clock = run([REFUSED], [record(("b", 7), (1, "b", 7))], wait=0)  # a standby's Register as R
    assert reg.taken_by == "b:7" and len(calls) == 1
    reg, calls, _ = run([OK], [None], wait=60)
    assert reg.status is OK and len(calls) == 1


def test_an_agent_yields_its_node_only_to_a_replacement_and_only_with_a_launcher_that_can_drop_its_node_rank() -> None:
    from taskd.agent.config import AgentConfig
    from taskd.agent.link.node_loss import NodeLoss
    from taskd.agent.ranks.launcher import MSRUN
    from taskd.agent.ranks.table import RankTable

    class Launcher:
        def __init__(self) -> None:
            self.node_ranks: list[int | None] = []

        def set_node_rank(self, node_rank: int | None) -> None:
            self.node_ranks.append(node_rank)

    def node_loss(taken_by: str | None, launcher: object) -> tuple[NodeLoss, SimpleNamespace]:
        link = SimpleNamespace(taken_by=taken_by)
        config = AgentConfig(launcher="taskd", node_rank=1, node_count=2)
        return NodeLoss(config, link, RankTable(), launcher), link  # type: ignore[arg-type]

    launcher = Launcher()
    loss, link = node_loss("b:7", launcher)
    assert loss.yield_node("j", 1) and launcher.node_ranks == [None]
    assert link.taken_by is None and not loss.yield_node("j", 1)  # asked once: the next refusal is an error
    loss, _ = node_loss(None, launcher)  # a duplicate, or any other refusal: no standby
    assert not loss.yield_node("j", 1)
    loss, _ = node_loss("b:7", MSRUN)  # msrun's node rank cannot change: the refusal stands
    assert not loss.yield_node("j", 1)
