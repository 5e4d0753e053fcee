"""Which returncodes say a signal ended a rank (the end-of-script rule of issue 32, F2, reads it)."""

from __future__ import annotations

import signal

from taskd.process.exitcodes import job_exit_code, killed_by_signal


def test_a_signal_is_popens_minus_n_or_a_shells_128_plus_n() -> None:
    assert killed_by_signal(-signal.SIGABRT) and killed_by_signal(-signal.SIGKILL)
    assert killed_by_signal(128 + signal.SIGABRT)  # a wrapper's shell reporting its killed child
    assert not any(killed_by_signal(code) for code in (None, 0, 1, 3, 127, 128, 200))


def test_job_exit_code_reads_signals_as_killed_by_signal_does():
    """A rank's code is turned into 100 + N exactly when killed_by_signal reads a signal in it; else passed on."""
    for code in (-9, -15, 128 + 6, 128 + 64):
        assert killed_by_signal(code) and job_exit_code(code) == min(100 + abs(code) % 128, 127)
    for code in (1, 3, 127, 128, 200, 255):
        assert not killed_by_signal(code) and job_exit_code(code) == code
