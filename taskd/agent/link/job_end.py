"""The end of a multi-node job: an agent whose ranks all finished waits, bounded, for the whole job to end.

Under msrun, node 0's msrun runs MindSpore's scheduler, which every node's ranks still need when they
unregister at exit. Were node 0's agent to reap it as soon as its own ranks ended, the other nodes'
ranks would retry unregistering forever and their msruns never exit. So an agent of a multi-node job
whose ranks all succeeded reports its finish and then waits until the controller says the job ended
(SUCCEEDED or FAILED), or, on the node that runs it, until the scheduler exits by itself, or until
`TASKD_SCHEDULER_GRACE` seconds passed. torchelastic's agents wait at an exit barrier for the same
reason. Every node then exits with the job's outcome, so msrun's exit codes and `taskd status` agree.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("taskd.agent")

TERMINAL_STATES = ("SUCCEEDED", "FAILED")
POLL_INTERVAL = 0.25  # seconds between two questions to the controller
AFTER_SCHEDULER = 5.0  # seconds the controller still gets to say so once the scheduler exited by itself


class JobStatusSource(Protocol):
    def job_state(self, timeout: float = 2.0) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class JobEnd:
    """How the wait ended: the controller's state ("" = it no longer knows the job, None = never said)."""

    state: str | None
    info: str
    waited: float
    why: str  # "controller", "scheduler exited", "grace", "signal", "unknown job"

    @property
    def failed(self) -> bool:
        return self.state == "FAILED"


def await_job_end(link: JobStatusSource, grace: float, scheduler_alive: Callable[[], bool] | None,
                  interrupted: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> JobEnd:
    """Ask the controller until the job is terminal; bounded by `grace` seconds (see the module's doc).

    `scheduler_alive` is None on a node that runs no scheduler; `interrupted` is polled (SIGTERM).
    """
    started = time.monotonic()
    deadline = started + grace
    state: str | None = None
    info = ""
    why = "grace"
    scheduler_gone = False
    while True:
        answer = link.job_state(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        if answer is not None:
            state, info = answer
            if state in TERMINAL_STATES:
                why = "controller"
                break
            if state == "":
                why = "unknown job"
                break
        if interrupted():
            why = "signal"
            break
        if scheduler_alive is not None and not scheduler_gone and not scheduler_alive():
            scheduler_gone = True  # every rank of the job unregistered: the controller hears of it soon
            deadline = min(deadline, time.monotonic() + AFTER_SCHEDULER)
            why = "scheduler exited"
        if time.monotonic() >= deadline:
            break
        sleep(POLL_INTERVAL)
    return JobEnd(state, info, time.monotonic() - started, why)


__all__ = ["TERMINAL_STATES", "JobEnd", "await_job_end"]
