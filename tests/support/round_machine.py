"""The agent's round machine driven as its unit tests drive it: a stand-in node, orders built as the link builds
them, the clock a number passed in (tests/unit/agent/round/test_round_machine.py, test_node_life.py)."""

from __future__ import annotations

from types import SimpleNamespace

from taskd.agent.link.orders import Command, Order
from taskd.agent.round import events as ev
from taskd.agent.round.rules import RoundMachine
from taskd.agent.round.states import LocalPolicy, NodeFacts, NodeState
from taskd.vocabulary import Action, FaultType, SignalType

S = NodeState
NOW = 100.0


class View:
    """Node 0 of the job: global ranks 0 and 1 are its local ranks 0 and 1; `paused` are live ranks paused in
    place (a type-"0" fault of a running rank)."""

    def __init__(self, paused: tuple[int, ...] = ()) -> None:
        self.paused = paused

    def local_of(self, faults: dict[int, str]) -> list[int]:
        return sorted(g for g in faults if g in (0, 1))

    def local_ranks(self) -> list[int]:
        return [0, 1]

    def live_fault(self, local_rank: int, faults: dict[int, str]) -> bool:
        return local_rank in self.paused and faults.get(local_rank) == FaultType.RECOVERABLE


def machine(state: NodeState = S.RUNNING, *, nodes: int = 1, live: bool = False, max_restarts: int = 3,
            paused: tuple[int, ...] = ()) -> RoundMachine:
    m = RoundMachine(NodeFacts(node_count=nodes, live=live, controller_timeout=30.0), View(paused),
                     budget=LocalPolicy(max_restarts, 30.0, 30.0))
    m.state = state
    if state is S.DEGRADED:
        m.budget.degraded = True
    return m


def order(command: Command, strategy: str = "", faults: dict[int, str] | None = None, extra: str = "",
          signal_type: str = SignalType.CHANGE_STRATEGY) -> Order:
    sig = SimpleNamespace(uuid="u", signal_type=signal_type, actions=[Action.CHANGE_STRATEGY],
                          fault_ranks={1: "1"} if faults is None else faults, strategy=strategy, timeout=30,
                          extra_params=extra)
    return Order.of(command, sig)


def change(strategy: str, faults: dict[int, str] | None = None, extra: str = "") -> ev.ChangeOrder:
    return ev.ChangeOrder(order(Command.CHANGE, strategy, faults, extra))


def of(actions: list, kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


def fault(rank: int = 1, fault_type: str = FaultType.PROCESS) -> ev.RankFault:
    return ev.RankFault(rank, rank, fault_type, f"rank {rank} exited with code 1")


def covers(rule_handler: str) -> str:
    return rule_handler  # marks the rule a test covers (test_every_rule_has_a_test reads these)
