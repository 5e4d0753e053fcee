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
