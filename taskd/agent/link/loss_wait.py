"""A survivor's console while its round waits for a lost node's replacement (issue 31, F10).

A node-loss round waits up to the controller's --node-rejoin-timeout (300 s by default) for a replacement
before it goes on; the survivors printed nothing meanwhile. The round's stopTrain and globalFault say what
it waits for (extraParams "awaiting": the node ranks, "rejoin_left": seconds until the controller gives up,
"rejoin_timeout": the flag's value); this says so once when the wait starts, then every `every(timeout)`
seconds while it lasts, and once when the round's strategy (or the job's end) ends it. Every duration is
measured on this node's clock from the moment it learned of the wait.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from taskd.agent.link.orders import Command, Order

log = logging.getLogger("taskd.agent")

EVERY = (5.0, 30.0)
"""Seconds between two "still waiting" lines: a tenth of the rejoin timeout, within these bounds."""
ENDS = frozenset({Command.CHANGE, Command.DUMP, Command.KILL, Command.FENCE})
"""The orders that end the wait: the round's strategy, or the job's end."""


@dataclass(frozen=True)
class Awaited:
    """What a node-loss round's signal says it waits for."""

    nodes: tuple[int, ...]
    left: float  # seconds until the controller stops waiting, when it sent the signal
    timeout: float  # its --node-rejoin-timeout


def awaited(extra_params: str) -> Awaited | None:
    """The wait a signal's extraParams announce; None for any other signal (or params taskd did not write)."""
    try:
        params = json.loads(extra_params or "{}")
        nodes = tuple(int(n) for n in params["awaiting"])
        left, timeout = float(params["rejoin_left"]), float(params["rejoin_timeout"])
    except (TypeError, ValueError, KeyError, RecursionError):
        return None
    return Awaited(nodes, left, timeout) if nodes and left >= 0 and timeout > 0 else None


def every(timeout: float) -> float:
    return min(max(timeout / 10, EVERY[0]), EVERY[1])


def _nodes(nodes: tuple[int, ...]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))


class LossWait:
    """The wait of one node for the replacements its round awaits; `on_order` and `tick` from the agent's loop."""

    def __init__(self) -> None:
        self.nodes: tuple[int, ...] = ()
        self.since: float | None = None  # when this node learned of the wait (monotonic)
        self.until = 0.0  # when the controller stops waiting, on this node's clock
        self.next_at = 0.0
        self.period = EVERY[1]

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def on_order(self, order: Order, now: float, own_node: int | None = None) -> None:
        """`own_node`: this agent's node rank (a replacement is not waiting for itself)."""
        if order.command in ENDS:
            self._end(now, f"changeStrategy {order.strategy}" if order.command is Command.CHANGE and order.strategy
                      else f"{order.command.value} order")
            return
        if order.command not in (Command.STOP, Command.STRATEGIES):
            return
        wait = awaited(order.extra_params)
        if wait is not None and own_node in wait.nodes:
            wait = Awaited(tuple(n for n in wait.nodes if n != own_node), wait.left, wait.timeout)
        if wait is None or not wait.nodes:
            return
        self.until = now + wait.left
        if wait.nodes == self.nodes and self.since is not None:
            return
        self.nodes, self.period = wait.nodes, every(wait.timeout)
        if self.since is None:
            self.since = now
        self.next_at = now + self.period
        who = " or ".join(f"`taskd run --node-rank {n} ...`" for n in wait.nodes)
        log.warning("%s lost: the round waits for a replacement (%s on a new host, or a `taskd run --standby`), at "
                    "most %.0fs more (the controller's --node-rejoin-timeout is %.0fs)", _nodes(wait.nodes), who,
                    wait.left, wait.timeout)

    def tick(self, now: float) -> None:
        if self.since is None or now < self.next_at:
            return
        self.next_at = now + self.period
        log.warning("still waiting for a replacement of %s: %.0fs so far, at most %.0fs more", _nodes(self.nodes),
                    now - self.since, max(self.until - now, 0.0))

    def _end(self, now: float, what: str) -> None:
        if self.since is None:
            return
        log.info("the wait for a replacement of %s ended after %.1fs: %s", _nodes(self.nodes), now - self.since, what)
        self.since, self.nodes = None, ()


__all__ = ["Awaited", "LossWait", "awaited", "every"]
