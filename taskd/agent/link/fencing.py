"""Whether this agent was fenced: declared lost by the controller and its node rank handed to another agent.

The controller says so three ways (COORDINATION's contract, item 6): a 411 answer to a report or a
Register, a `FencedError` from the client, or one `taskd.fenced` signal on a new stream. An agent that
was SIGSTOPped or cut off may hear none of them at once (its stream is gone), so while it has no stream
it asks for itself: a Register in the background, which a fenced identity gets refused with 411. Any
of these becomes one FENCE order on the agent's queue, carried out by the round machine (every rank
SIGKILLed first, then exit 1: round/rules.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from taskd.client.errors import FencedError
from taskd.vocabulary import Code

log = logging.getLogger("taskd.agent")

PROBE_AFTER = 1.0  # seconds without the signal stream before asking whether this agent was fenced
PROBE_EVERY = 2.0  # seconds between two such questions


class Fencing:
    """Turns whatever says "fenced" into one order (`on_fenced(reason_json)`), and asks when cut off."""

    def __init__(self, on_fenced: Callable[[str], None]) -> None:
        self._on_fenced = on_fenced
        self.fenced: str | None = None  # why, once the controller said so
        self._disconnected_since: float | None = None
        self._next_probe = 0.0
        self._probe: threading.Thread | None = None

    def fence(self, why: str) -> None:
        """Once, whichever way the controller said it."""
        if self.fenced is not None:
            return
        self.fenced = why or "the controller refused this agent (411: fenced)"
        self._on_fenced(json.dumps({"reason": self.fenced}))

    def probe(self, client: Any, connected: bool, now: float, silent_for: float = 0.0) -> None:
        """Without the signal stream for PROBE_AFTER seconds (a SIGSTOPped agent just continued, a healed
        partition), ask in the background, at most every PROBE_EVERY seconds; `client` is the RecoverClient.
        `silent_for`: seconds since its last signal, so that an agent that was stopped asks at once."""
        if client is None or self.fenced is not None or connected:
            self._disconnected_since = None
            return
        if self._disconnected_since is None:
            self._disconnected_since = now - max(0.0, silent_for)
        if now - self._disconnected_since < PROBE_AFTER or now < self._next_probe or \
                (self._probe is not None and self._probe.is_alive()):
            return
        self._next_probe = now + PROBE_EVERY
        self._probe = threading.Thread(target=self._ask, args=(client,), name="taskd-fence-probe", daemon=True)
        self._probe.start()

    def _ask(self, client: Any) -> None:
        try:
            status = client.register(timeout=2.0)
        except FencedError as exc:
            self.fence(str(exc))
        except Exception as exc:  # unreachable: nothing is known, the next probe asks again
            log.debug("fence probe: %s", exc)
        else:
            if status.code == Code.FENCED:
                self.fence(status.info)


__all__ = ["PROBE_AFTER", "PROBE_EVERY", "Fencing"]
