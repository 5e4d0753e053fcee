"""The job's status as the agent waits on it: every node joined before its ranks start, the whole job ended after.

The start of a multi-node job: an agent starts its ranks only once every node of the job has joined.

torchrun's rendezvous makes a fixed-size job wait for all its nodes, at most `join_timeout` (600 s by
default), before any worker starts. taskd has no rendezvous: nodes meet at the controller. So an agent
of a multi-node job, once registered, asks the controller (taskd.v1 JobStatus lists the registered
agents) until every node of the job is there, at most `TASKD_JOIN_TIMEOUT` seconds (`taskd run
--rdzv-conf join_timeout=N`); then it starts its ranks, or, at the timeout, exits 1 naming the missing
nodes with no rank started. A single-node job does not ask at all. The controller fails a job whose
nodes never all join on its own clock too (`taskd server --join-timeout`), which this wait sees as
the job FAILED. A controller that serves only ClusterD's Recover service cannot be asked: the agent
starts at once, as before.

The end of a multi-node job: an agent whose ranks all finished waits, bounded, for the whole job to end.

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
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from taskd.agent.link.controller import JobStatusUnsupported
from taskd.agent.round.events import Ended

log = logging.getLogger("taskd.agent")

FIRST_POLL = 0.05  # seconds before the second question; doubled up to the cap
POLL_CAP = 0.5  # seconds between two questions for a small job (see poll_cap)
SHOWN = 20  # missing nodes named in a line; the rest are counted


class JobNodesSource(Protocol):
    def job_nodes(self, timeout: float = 2.0) -> tuple[str, str, frozenset[int], frozenset[int]] | None: ...


def poll_cap(node_count: int) -> float:
    """The longest pause between two questions: each answer lists every registered agent, so a job of
    thousands of nodes asks less often (up to 5 s) to keep the controller's load bounded."""
    return min(5.0, max(POLL_CAP, node_count / 200))


def format_nodes(nodes: list[int]) -> str:
    """`[0, 3]`; a long list is cut: `[0, 1, ..., 19, ...] (250 nodes)`."""
    head = ", ".join(map(str, nodes[:SHOWN]))
    return f"[{head}, ...] ({len(nodes)} nodes)" if len(nodes) > SHOWN else f"[{head}]"


@dataclass(frozen=True)
class Join:
    """How the wait ended: `why` is "joined", "timeout", "failed" (the controller ended the job), "unknown job",
    "signal" or "unsupported" (the controller cannot say who joined)."""

    why: str
    job_id: str
    node_count: int
    joined: frozenset[int]
    waited: float
    timeout: float
    info: str = ""

    @property
    def missing(self) -> list[int]:
        return [n for n in range(self.node_count) if n not in self.joined]

    @property
    def may_start(self) -> bool:
        return self.why in ("joined", "unsupported")

    @property
    def hint(self) -> str:
        """What to check, for the console line (not the controller's record)."""
        if self.why != "timeout":
            return ""
        return (" (is every node started, with the same job id and controller? The wait is TASKD_JOIN_TIMEOUT or "
                "taskd run --rdzv-conf join_timeout=SECONDS)")

    def problem(self) -> str:
        """Why no rank starts (for a wait that did not end with every node there, other than a signal)."""
        if self.why == "timeout":
            return (f"node(s) {format_nodes(self.missing)} of job {self.job_id} did not join within "
                    f"{self.timeout:g}s ({len(self.joined)}/{self.node_count} joined)")
        if self.why == "unknown job":
            return f"the controller no longer knows job {self.job_id} ({self.info}) while its nodes were joining"
        detail = f": {self.info}" if self.info else ""
        return f"job {self.job_id} ended before all its nodes joined{detail}"


def await_nodes(source: JobNodesSource, job_id: str, node_count: int, timeout: float,
                interrupted: Callable[[], bool], sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> Join:
    """Ask the controller until every node 0..node_count-1 registered, or is absent (a `--nnodes MIN:MAX` job the
    controller started without it after the last call); bounded by `timeout` seconds."""
    started = clock()
    deadline = started + timeout
    interval, cap = FIRST_POLL, poll_cap(node_count)
    joined: frozenset[int] = frozenset()
    absent: frozenset[int] = frozenset()
    info = ""
    logged = False
    while True:
        try:
            answer = source.job_nodes(timeout=max(0.1, min(2.0, deadline - clock())))
        except JobStatusUnsupported as exc:
            log.warning("%s: starting without waiting for the other nodes", exc)
            why = "unsupported"
            break
        if answer is not None:
            state, info, joined, absent = answer
            if state == "":
                why = "unknown job"
                break
            if state in ("SUCCEEDED", "FAILED"):
                why = "failed"
                break
            if all(n in joined or n in absent for n in range(node_count)):
                why = "joined"
                break
            if not logged:
                missing = [n for n in range(node_count) if n not in joined]
                log.info("waiting for nodes %s of job %s to join (%d/%d joined)", format_nodes(missing), job_id,
                         len(joined), node_count)
                logged = True
        if interrupted():
            why = "signal"
            break
        left = deadline - clock()
        if left <= 0:
            why = "timeout"
            break
        sleep(min(interval, left))
        interval = min(cap, interval * 2)
    join = Join(why, job_id, node_count, joined, clock() - started, timeout, info)
    if logged and why == "joined" and absent:
        log.info("job %s starts with %d of %d node(s) after %.1fs (the last call of --nnodes MIN:MAX): node(s) %s "
                 "grow it when they join", job_id, node_count - len(absent), node_count, join.waited,
                 format_nodes(sorted(absent)))
    elif logged and why == "joined":
        log.info("all %d nodes of job %s joined after %.1fs", node_count, job_id, join.waited)
    return join


def join_or_end(source: JobNodesSource, job_id: str, node_count: int, timeout: float,
                signalled: Callable[[], int | None]) -> Ended | None:
    """A multi-node job's ranks start once all its nodes joined (a one-node job asks nothing): None then, else how
    the node's life ends with no rank started (the round machine's `Ended`). `signalled`: SIGTERM/SIGINT's number."""
    if node_count == 1:
        return None
    join = await_nodes(source, job_id, node_count, timeout, lambda: signalled() is not None)
    signum = signalled()
    if join.why == "signal" and signum is not None:
        name = signal.Signals(signum).name
        log.warning("received %s while the job's nodes were joining: no rank started", name)
        return Ended(False, 128 + signum, f"agent received {name}")
    if not join.may_start:
        log.error("%s: no rank started%s", join.problem(), join.hint)
        return Ended(False, 1, join.problem())
    return None


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


__all__ = ["TERMINAL_STATES", "JobEnd", "JobNodesSource", "Join", "await_job_end", "await_nodes", "format_nodes",
           "join_or_end", "poll_cap"]
