"""Registration and fencing: a node rank another agent holds, a fenced agent, a continued rank's word.

Whether this agent was fenced: declared lost by the controller and its node rank handed to another agent.

The controller says so three ways (COORDINATION's contract, item 6): a 411 answer to a report or a
Register, a `FencedError` from the client, or one `taskd.fenced` signal on a new stream. An agent that
was SIGSTOPped or cut off may hear none of them at once (its stream is gone), so while it has no stream
it asks for itself: a Register in the background, which a fenced identity gets refused with 411. Any
of these becomes one FENCE order on the agent's queue, carried out by the round machine (every rank
SIGKILLed first, then exit 1: round/rules.py).

A node rank another agent holds when this one registers (issue 17): wait for it, yield to it, or fail.

The controller refuses a Register for node R with 409 while another live agent holds R (controller/machine/job.py,
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

The agent's half of the continue handshake: a rank continued after a stop waits for this word.

A rank that receives SIGCONT holds before its next step (`taskd.worker.continued`) and asks through its
heartbeat file. The agent asks the controller, by a HealthCheck sent after the rank asked, whether it still
holds its node: "yes" is written back as the time it asked, and the rank goes on; "fenced" (411) becomes the
agent's FENCE order, which kills the waiting ranks before they take a step (issue 31, F1: a whole node
SIGSTOPped until it was replaced, continued after its job ended, wrote checkpoints and outputs for 39 s).
An agent without a controller (standalone, degraded) cannot be fenced: it answers at once. A controller that
does not answer is asked again every `RETRY` seconds; the rank's own limit ends its wait.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from taskd.client.errors import FencedError
from taskd.proto import taskd_pb2
from taskd.vocabulary import Code
from taskd.worker.heartbeat_file import HeartbeatFile

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


# the words of the controller's refusal of a node rank another live agent holds (controller/machine/job.py)
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


RETRY = 0.5  # seconds between two questions while the controller does not answer


class ContinueWord:
    """Answers the ranks that ask whether they may go on after a stop (see the module's doc)."""

    def __init__(self, client: Callable[[], Any], fence: Callable[[str], None]) -> None:
        self._client = client  # the RecoverClient, None without a controller
        self._fence = fence
        self._asking: threading.Thread | None = None
        self._next = 0.0

    def watch(self, files: Iterable[HeartbeatFile | None], now: float, alone: bool = False) -> None:
        """Each turn of the agent's loop: the ranks that asked get their answer, or a question is on its way.
        `alone`: the agent runs degraded (no controller to ask, none to fence it)."""
        waiting = [f for f in files if f is not None and _asked(f) is not None]
        if not waiting or (self._asking is not None and self._asking.is_alive()) or now < self._next:
            return
        client = None if alone else self._client()
        if client is None:
            _answer(waiting, time.monotonic())
            return
        self._next = now + RETRY
        self._asking = threading.Thread(target=self._ask, args=(client, waiting), name="taskd-continue", daemon=True)
        self._asking.start()

    def _ask(self, client: Any, waiting: list[HeartbeatFile]) -> None:
        asked_at = time.monotonic()  # after every rank in `waiting` asked: the answer covers each of them
        try:
            status = client.health_check()
        except FencedError as exc:
            self._fence(str(exc))
            return
        except Exception as exc:  # unreachable, or closing: the next turn asks again
            log.debug("continue check: %s", exc)
            return
        if status.code == Code.FENCED:
            self._fence(status.info)
        elif status.code == Code.OK:
            log.info("continued after a stop: the controller still counts this agent as node's holder; ranks go on")
            _answer(waiting, asked_at)
        else:
            log.debug("continue check answered %d: %s", status.code, status.info)


def _asked(f: HeartbeatFile) -> float | None:
    try:
        return f.continue_asked()
    except (OSError, ValueError):  # the file went away with its rank
        return None


def _answer(files: list[HeartbeatFile], asked_at: float) -> None:
    for f in files:
        try:
            f.answer_continue(asked_at)
        except (OSError, ValueError):
            pass

__all__ = ["HELD", "PROBE_AFTER", "PROBE_EVERY", "RETRY", "ContinueWord", "Fencing", "Registration", "held",
           "register_held", "replacement_holder"]
