"""The agent's round machine: one node's recovery as a pure state machine over a rule table.

Events go in (with the time, monotonic, passed by the caller) and actions come out; the machine does no
I/O, reads no clock and touches no process, and it imports only the standard library and its own parts
(an order is `agent/link/orders.py`'s, not the gRPC link's: tests/unit/agent/test_machine_imports.py). The
parts: `events` (what goes in and comes out), `states` (the states and the machine's data),
`handlers` and `rules` (which handler runs for which event in which state, and where it may
lead). The supervisor sequences it: it pulls events (rank exits, orders, timers, signals), feeds them here
one at a time, and has the executors (agent/round/actions.py) carry out the actions; whatever those produce (a
start's result, the ranks it found already gone) is queued as the next events, never handled inside the
handler that caused them.
"""

from __future__ import annotations

import logging

from taskd.agent.round.events import Action, Note
from taskd.agent.round.rules import check_target, find_rule
from taskd.agent.round.states import TERMINAL, NodeRound, NodeState


class RoundMachine(NodeRound):
    """One node's recovery state. Drive it with `handle(event, now)`."""

    def handle(self, event: object, now: float) -> list[Action]:
        """Apply the table's rule for this event in the current state, check where it led, return the actions."""
        if self.state in TERMINAL:
            return []
        rule = find_rule(type(event), self.state)
        if rule is None:
            return [Note(logging.DEBUG, f"{type(event).__name__} in {self.state.value}: no rule, dropped")]
        out: list[Action] = []
        source = self.state
        target = rule.handler(self, event, now, out)
        check_target(rule, source, target)
        self.state = target
        return out

    @property
    def waits_on_controller(self) -> bool:
        """A round waits on the controller's next signal, which a lost controller never sends (the loss timer
        runs). A pending fault report has its own deadline instead."""
        return self.state in (NodeState.STOPPING, NodeState.REBUILDING)


__all__ = ["RoundMachine"]
