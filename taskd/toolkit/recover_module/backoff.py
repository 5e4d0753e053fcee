"""Capped exponential backoff with jitter.

Jitter matters because a controller restart makes every agent of every job reconnect at
once; spreading the retries keeps the burst under gRPC's pending-request limits.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays `initial * multiplier**n`, capped at `maximum`, each shortened by up to `jitter`."""

    def __init__(self, initial: float = 0.5, maximum: float = 10.0, multiplier: float = 2.0, jitter: float = 0.3):
        if initial <= 0 or maximum < initial or multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError(
                f"bad backoff: initial={initial} maximum={maximum} multiplier={multiplier} jitter={jitter}"
            )
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._attempt = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; grows until it reaches the cap."""
        base = min(self.maximum, self.initial * self.multiplier ** min(self._attempt, 64))
        self._attempt += 1
        return base * (1.0 - self.jitter * random.random())

    def reset(self) -> None:
        """Start again from `initial` (after a success)."""
        self._attempt = 0
