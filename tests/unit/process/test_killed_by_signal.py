"""Which returncodes say a signal ended a rank (the end-of-script rule of issue 32, F2, reads it)."""

from __future__ import annotations

import signal

from taskd.process.exitcodes import killed_by_signal


def test_a_signal_is_popens_minus_n_or_a_shells_128_plus_n() -> None:
    assert killed_by_signal(-signal.SIGABRT) and killed_by_signal(-signal.SIGKILL)
    assert killed_by_signal(128 + signal.SIGABRT)  # a wrapper's shell reporting its killed child
    assert not any(killed_by_signal(code) for code in (None, 0, 1, 3, 127, 128, 200))
