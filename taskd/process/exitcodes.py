"""Exit statuses as people read them: the agent's event lines and `taskd run`'s own exit code."""

from __future__ import annotations

import signal

# What the agent (taskd run, msrun) exits with after the `dump` strategy ended the job: whoever reaped the fault
# rank and whatever killed it, so that an operator (and a Kubernetes podFailurePolicy) reads what happened, never
# a rank's 137 that looks like the pod was OOM-killed.
DUMPED_EXIT = 3  # every healthy rank saved its dump, then the job ended
DUMP_INCOMPLETE_EXIT = 4  # asked to dump, and some rank (or every one) saved nothing within the dump timeout


def describe_returncode(code: int | None) -> str:
    """A Popen returncode for event lines: 'exited with code 3', 'killed by SIGKILL', 'running' (None)."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def exit_code_of(code: int | None) -> int:
    """A Popen returncode as a shell would report it: 128 + N for signal N; 1 when unknown (None)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def killed_by_signal(code: int | None) -> bool:
    """Whether a Popen returncode says a signal ended the process: -N, or 128 + N as a wrapper's shell reports it."""
    return code is not None and 128 < exit_code_of(code) <= 128 + 64


RANK_SIGNAL_BASE = 100  # a failed job whose rank died of signal N exits 100 + N: never 128 + N (see job_exit_code)


def job_exit_code(code: int | None) -> int:
    """`taskd run`'s exit code for a job that failed because a rank ended with Popen returncode `code`.

    A rank's own exit code 1-127 is passed on. A rank killed by signal N (or exiting 128 + N, as a shell reports a
    killed child) gives 100 + N (109 for SIGKILL, 115 for SIGTERM; 127 for signals above 26), so that 128 + N only
    ever means `taskd run` itself got signal N: a Kubernetes podFailurePolicy that retries a pod SIGKILLed by the
    OOM killer (exit 137) must not read a job that taskd failed as one. A code `killed_by_signal` does not read as a
    signal (128, 193-255) is the rank's own and passed on. 1 when the code is unknown (None)."""
    shell = exit_code_of(code)
    if not killed_by_signal(code):
        return shell or 1
    return min(RANK_SIGNAL_BASE + shell - 128, 127)
