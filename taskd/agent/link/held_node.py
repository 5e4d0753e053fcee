"""A node rank another agent holds when this one registers (issue 17): wait for it, yield to it, or fail.

The controller refuses a Register for node R with 409 while another live agent holds R (controller/job.py,
`holder_refusal`; an agent it declared lost holds nothing). Three cases get that answer; the agent tells them
apart by its job's record (taskd.v1 JobStatus), by typed fields rather than the refusal's words:

- **R was taken over**: its holder is the replacement of R's lost agent (a `NodeLossRecord` of R names the
  holder's host and pid as the new ones): a standby, or a replacement started by hand, took the node before
  this agent came. Under Kubernetes this is the lost pod that the indexed Job or JobSet recreated with the same
  index. Nothing is wrong, and a non-zero exit would be counted against the Job (its podFailurePolicy,
  backoffLimit): the agent joins the job as a standby instead (`Registration.taken_by`; agent/link/node_loss.py),
  takes over the next node lost, and exits 0 if the job ends without needing it. This is the default, as
  torchrun's elastic agent keeps a node beyond the job's size waiting for the next rendezvous; under msrun,
  whose node rank cannot change, it is the refusal as before.
- **R's loss is pending**: its holder is the node's own agent, not declared lost yet (its stream ended less than
  --agent-loss-grace ago, or a dead host's connection is not yet closed by the pings). A replacement started
  that early asks again every `POLL` s for up to twice TASKD_CONTROLLER_TIMEOUT (60 s by default; the pings
  close a dead host's connection within 15 s, the grace adds 5 s). Meanwhile a standby may take R over: then
  this agent yields as above.
- **a duplicate**: two live agents were given node rank R. The first keeps it; the second, its wait over,
  exits 1 with the controller's refusal (which asks whether the node rank was given to two agents).

A controller that offers no JobStatus (ClusterD) cannot say who holds R: there every 409 is the refusal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskd.proto import taskd_pb2
from taskd.vocabulary import Code

log = logging.getLogger("taskd.agent")

# the words of the controller's refusal of a node rank another live agent holds (controller/job.py)
HELD = "is held by a live agent"
POLL = 0.5  # seconds between a held Register's attempts (set-up only: no rank runs yet)


def held(status: Any) -> bool:
    """A Register refused because another live agent holds the node rank."""
    return status.code == Code.INVALID_PARAMS and HELD in status.info


def replacement_holder(record: taskd_pb2.JobRecord, node_rank: int) -> str | None:
    """`host:pid` of the agent holding `node_rank` when it is the replacement of the node's lost agent (a
    node-loss record of that node names it as the new holder); None when the holder is the node's own agent,
    or nobody holds it."""
    for a in record.agents:
        if a.standby or a.nodeRank != node_rank or not a.pid:
            continue
        for r in record.rounds:
            if any(x.nodeRank == node_rank and (x.newHost, x.newPid) == (a.host, a.pid) for x in r.nodeLosses):
                return f"{a.host}:{a.pid}"
    return None


@dataclass(frozen=True)
class Registration:
    """How a Register ended: the controller's last answer, and who took the node over (then it was refused)."""

    status: Any
    taken_by: str | None = None


def register_held(register: Callable[[], Any], record: Callable[[], taskd_pb2.JobRecord | None], node_rank: int,
                  wait: float, sleep: Callable[[float], object] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> Registration:
    """Register; while node `node_rank` is held, ask again for up to `wait` seconds, unless its holder is a
    replacement (then stop at once: `taken_by`). `record` is the job's record, None when there is none to read."""
    status = register()
    deadline = clock() + wait
    warned = False
    while held(status):
        rec = record()
        holder = replacement_holder(rec, node_rank) if rec is not None else None
        if holder is not None:
            return Registration(status, holder)
        if clock() >= deadline:
            break
        if not warned:
            log.warning("%s: waiting up to %.0fs for the controller to declare that agent lost (a replacement "
                        "started before it did)", status.info, wait)
            warned = True
        sleep(POLL)
        status = register()
    return Registration(status)


__all__ = ["HELD", "Registration", "held", "register_held", "replacement_holder"]
