"""Which stale rank hung: the decision behind `HangWatch.culprits`, pure (no process, no file).

In a collective job every rank stops beating when one hangs: the others wait for it inside the
next collective. Naming the wrong one sends the fault, the stacks and the operator's attention to
a healthy rank, so the evidence is weighed strongest first and, when it does not decide, the
answer is "cannot tell which rank", never a guess:

1. a stopped process (SIGSTOP, a debugger; state T) hangs whatever else is true;
2. collective markers (`taskd.worker.live`): a stale rank inside a collective waits on a peer;
3. the step of the last heartbeat: a rank at an earlier step than the others stopped first. At the
   same step the times say nothing (the rank that hangs may beat after the one that then waits for
   it), so same-step heartbeats are equal; without steps, only a gap over half the timeout counts;
4. the stacks: a rank whose stacks stop in the script's own code, while the others' stop inside the
   framework (a collective, a device sync), where a rank waiting on a peer is.

A rank that is stale while a peer at the same step still beats is not judged yet: within a sweep
or two the peer either goes stale too (then 4 decides) or moves on (then 3 does). Nor are ranks
whose stacks all stop inside the framework, until twice the timeout: the rank they wait on may be
on another node, whose agent names it first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Where a rank that waits on a peer is found in its stacks: inside the framework (a collective, a device sync
# such as MindSpore's `asnumpy` after an AllReduce, a compiled step). Measured with tests/mindspore_scripts/
# ms_stall.py: the waiting rank's innermost frame was mindspore/common/tensor.py `asnumpy`, the stalled one's
# the script's own `time.sleep` loop. The standard library and taskd's own frames are looked through (a
# queue.get or a lock called from the framework waits in the framework; called from the script, in the script).
# Installed packages only: a script's own directory may well be called "mindspore" (examples/mindspore/).
FRAMEWORK_PATH = re.compile(r"/(?:site|dist)-packages/(?:torch|mindspore|torch_npu|deepspeed|megatron)/")
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
_TASKD = "/taskd/"
_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line \d+ in (?P<func>\S+)', re.MULTILINE)
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<path>[^:()]+):\d+\)", re.MULTILINE)


def waits_in_framework(dump: str) -> bool | None:
    """From a stack dump (faulthandler's or py-spy's): True when the signalled (main) thread is inside the
    framework's code, False when it is in the script's own, None when the dump has no frame."""
    block = _main_thread(dump)
    frames = [m.group("path") for m in _FAULTHANDLER_FRAME.finditer(block)] or \
             [m.group("path") for m in _PYSPY_FRAME.finditer(block)]  # both innermost first
    if not frames:
        return None
    for path in frames:
        norm = path.replace("\\", "/")
        if _STDLIB.search(norm) or _TASKD in norm:
            continue
        return bool(FRAMEWORK_PATH.search(norm))
    return False  # only the standard library: e.g. a script's bare `time.sleep` at module level


def _main_thread(dump: str) -> str:
    """faulthandler marks the thread that ran its handler "Current thread" (the main one for a process
    signal); py-spy names "MainThread". Without either mark, the first block."""
    for mark in ("Current thread ", '"MainThread"'):
        at = dump.find(mark)
        if at >= 0:
            rest = dump[at:]
            nxt = re.search(r"^(Thread |Current thread |Process )", rest[len(mark):], re.MULTILINE)
            return rest[: len(mark) + nxt.start()] if nxt else rest
    return dump


@dataclass(frozen=True)
class Suspect:
    """One running rank of the node as the sweep saw it."""

    rank: int  # global rank
    stale: bool  # past its heartbeat deadline
    step: int | None  # of its last heartbeat
    quiet: float  # seconds since its last sign of progress
    stopped: bool = False  # process state T (SIGSTOP) or t (traced)
    marked: bool = False  # it declares collectives (live markers): `waiting` then means something
    waiting: bool = False  # its markers say: inside a collective, or paused for a rebuild
    in_framework: bool | None = None  # its stacks stop inside the framework (None: not taken, or no frame)


@dataclass(frozen=True)
class Verdict:
    culprits: tuple[int, ...] = ()  # ranks to fault; every stale rank when undecided
    waiting: tuple[int, ...] = ()  # stale ranks that wait on the culprits
    reason: str = ""
    decided: bool = True  # False: "cannot tell which rank"
    defer: bool = False  # not yet: ask again on the next sweep
    need_stacks: bool = False  # the stacks would decide: take them, fill `in_framework`, ask again


def decide(suspects: Sequence[Suspect], timeout: float, stacks_taken: bool = False) -> Verdict:
    """The culprits among the stale suspects, why, and who waits on them (module docstring)."""
    stale = [s for s in suspects if s.stale]
    if not stale:
        return Verdict()
    if any(s.marked or s.waiting for s in stale):
        return _by_markers(stale)
    stopped = [s for s in suspects if s.stopped]  # stale or not yet: it stopped, so the others wait on it
    if stopped:
        return _verdict(stale, stopped, "its process is stopped (SIGSTOP or a debugger): it cannot make progress")
    behind = _behind(suspects, stale, timeout)
    if behind:  # a rank at an earlier step cannot be waiting on peers inside a later step's collective
        return _verdict(stale, *behind)
    fresh = [s for s in suspects if not s.stale and not s.stopped]
    if fresh and _same_step(stale, fresh) and max(s.quiet for s in stale) < 2 * timeout:
        return Verdict(defer=True, reason=f"rank(s) {_ids(fresh)} still beat at the same step: judged next sweep")
    if not stacks_taken:
        return Verdict(need_stacks=True)
    framework = [s for s in stale if s.in_framework is True]
    own = [s for s in stale if s.in_framework is False]
    if own and (framework or len(stale) == 1 and not fresh):
        why = "its stacks stop in the script's own code" + (
            f", those of rank(s) {_ids(framework)} inside the framework (waiting on it)" if framework else "")
        return _verdict(stale, own, why)
    if len(framework) == len(stale) and max(s.quiet for s in stale) < 2 * timeout:
        # every stale rank here waits inside the framework: the one they wait on may be on another node,
        # whose agent names it within a sweep or two; only past twice the timeout are these judged
        return Verdict(defer=True, reason=f"rank(s) {_ids(stale)} wait inside the framework: judged next sweep")
    return Verdict(culprits=tuple(s.rank for s in stale), reason=_undecided(stale, framework, own), decided=False)


def stall_in_sight(suspects: Sequence[Suspect], timeout: float) -> bool:
    """What a derived timeout (no setting) needs before it judges: a stopped rank, or a second rank of this
    node quiet too (waiting on the first). A rank quiet alone may be past its last step, writing results or
    lingering while its peers have exited (the CI saw a 2-node msrun job failed so): only a heartbeat timeout
    the user set judges that, or `taskd.worker.finished()` says it."""
    return any(s.stopped for s in suspects) or sum(s.quiet >= timeout / 2 for s in suspects) >= 2


def _by_markers(stale: list[Suspect]) -> Verdict:
    """Ranks that mark their collectives say themselves whether they wait; a stopped one hangs regardless."""
    culprits = [s for s in stale if not s.waiting or s.stopped]
    if not culprits:  # all wait inside a collective: the rank they wait on is on another node
        return Verdict(waiting=tuple(s.rank for s in stale))
    why = "not inside a collective (its markers)" if any(not s.stopped for s in culprits) else "process stopped"
    return _verdict(stale, culprits, why)


def _behind(suspects: Sequence[Suspect], stale: list[Suspect], timeout: float) -> tuple[list[Suspect], str] | None:
    """Stale ranks whose last heartbeat is older than every other rank's: an earlier step, or, without steps,
    more than half the timeout earlier."""
    if len(suspects) < 2:
        return None
    if all(s.step is not None for s in suspects):
        low = min(s.step for s in stale)  # type: ignore[type-var]
        behind = [s for s in stale if s.step == low]
        others = [s for s in suspects if s not in behind]
        if others and all(o.step > low for o in others):  # type: ignore[operator]
            return behind, f"its last heartbeat is at step {low}, the others' at step {min(o.step for o in others)}"
        return None
    oldest = max(s.quiet for s in stale)
    behind = [s for s in stale if oldest - s.quiet < timeout / 2]
    others = [s for s in suspects if s not in behind]
    if others and all(s.quiet - o.quiet > timeout / 2 for s in behind for o in others):
        return behind, f"its last heartbeat is {oldest - max(o.quiet for o in others):.1f}s older than the others'"
    return None


def _same_step(stale: list[Suspect], fresh: list[Suspect]) -> bool:
    return any(f.step is None or s.step is None or f.step == s.step for s in stale for f in fresh)


def _verdict(stale: list[Suspect], culprits: list[Suspect], reason: str) -> Verdict:
    """`culprits` may include a stopped rank not yet past its deadline; `waiting` are the other stale ones."""
    names = {s.rank for s in culprits}
    return Verdict(culprits=tuple(sorted(names)), waiting=tuple(sorted(s.rank for s in stale if s.rank not in names)),
                   reason=reason)


def _undecided(stale: list[Suspect], framework: list[Suspect], own: list[Suspect]) -> str:
    steps = sorted({s.step for s in stale if s.step is not None})
    at = f" at step {steps[0]}" if len(steps) == 1 else ""
    if len(stale) == 1:
        told = "its stacks stop inside the framework" if framework else "its stacks do not say where it waits"
        return f"cannot tell which rank hung: rank {stale[0].rank} stopped beating{at}, is not stopped, and " \
               f"{told}; the rank it waits on may be on another node"
    if framework and not own:
        told = "every one's stacks stop inside the framework"
    elif own and not framework:
        told = "every one's stacks stop in the script's own code"
    else:
        told = "their stacks do not show which one waits"
    return f"cannot tell which rank hung: ranks {_ids(stale)} stopped beating{at} together, none is stopped, " \
           f"and {told}"


def _ids(suspects: Sequence[Suspect]) -> list[int]:
    return sorted(s.rank for s in suspects)


# The hang timeout msrun jobs get when none is set (issue 37): a rank quiet for FACTOR times the slowest step
# seen (the first step excluded: TaskdCallback runs it in a section of its own), and never less than FLOOR
# seconds. Below the collective timeout the ranks run with, so that taskd, not the collective, finds the hang.
AUTO_FLOOR = 5.0
AUTO_FACTOR = 10.0
AUTO_SAMPLES = 2  # step times seen before the derived timeout applies
STOPPED_AFTER = 1.0  # seconds the agent must have seen a rank stopped (state T or t) at every look before it is
#                      a hang: not a job-wide SIGSTOP/SIGCONT (`scontrol suspend`) whose SIGCONT reached the agent
#                      first, nor a `py-spy dump` of a healthy rank (it holds the rank for ~0.1 s)
STOP_LOOK = 0.25  # seconds between the agent's looks at its running ranks' process states (hang detection on)
STOP_GAP = 4 * STOP_LOOK  # looks further apart than this (the agent itself stopped or starved) start over


class StopLooks:
    """How long each rank has been seen stopped at every one of the agent's looks, without a gap between them.

    A SIGSTOPped rank beats no more, but waiting for its heartbeat's age to tell costs seconds; its process
    state tells at once. Only a state held across looks is believed: the agent may itself have been stopped
    with the whole job and continued first (its looks then have a gap, and the count starts over)."""

    def __init__(self) -> None:
        self._since: dict[tuple[int, int], float] = {}  # (local rank, pid) -> first look that saw it stopped
        self._last: float | None = None
        self.next_at = 0.0  # monotonic time of the next look

    def look(self, stopped: Iterable[tuple[int, int]], now: float) -> bool:
        """Record one look (the (local rank, pid) of every rank seen stopped at monotonic `now`); True when one
        has been stopped for STOPPED_AFTER seconds."""
        gap = self._last is None or now - self._last > STOP_GAP
        self._since = {key: now if gap else self._since.get(key, now) for key in stopped}
        self._last, self.next_at = now, now + STOP_LOOK
        return any(now - since >= STOPPED_AFTER for since in self._since.values())

    def held(self, local_rank: int, pid: int) -> float:
        """Seconds the rank had been seen stopped at the last look (0: not seen stopped then)."""
        since = self._since.get((local_rank, pid))
        return 0.0 if since is None or self._last is None else self._last - since


COLLECTIVE_TIMEOUTS = ("MS_CPU_COMM_OP_TIMEOUT", "HCCL_EXEC_TIMEOUT")
MS_CPU_COMM_DEFAULT = 30.0  # MindSpore's CPU collectives give up after this many seconds when the variable is unset


def collective_timeout(environ: Mapping[str, str]) -> float | None:
    """The lowest collective timeout the ranks' environment sets (MindSpore CPU, HCCL), or None when none is set."""
    found = []
    for name in COLLECTIVE_TIMEOUTS:
        try:
            value = float(environ.get(name, ""))
        except ValueError:
            continue
        if value > 0:
            found.append(value)
    return min(found) if found else None


@dataclass
class AutoTimeout:
    """The hang timeout derived from the job's own step times (module constants above); pure."""

    cap: float | None = None  # half the collective timeout the environment sets, when it does
    slowest: float = 0.0
    samples: int = 0
    _last: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (step, wall time) last seen

    def observe(self, rank: int, step: int | None, when: float) -> None:
        """A rank's heartbeat (step, wall time) as a sweep read it: each step advance is a step-time sample."""
        if step is None or when <= 0:
            return
        last = self._last.get(rank)
        self._last[rank] = (step, when)
        if last is None or step <= last[0] or last[0] < 1:  # the first step (compilation) is no sample
            return
        self.slowest = max(self.slowest, (when - last[1]) / (step - last[0]))
        self.samples += 1

    def forget(self, rank: int) -> None:
        """A new incarnation of the rank: its next beat is no step advance of the old one's."""
        self._last.pop(rank, None)

    @property
    def value(self) -> float | None:
        """The timeout, or None until enough steps were seen."""
        if self.samples < AUTO_SAMPLES:
            return None
        derived = max(AUTO_FLOOR, AUTO_FACTOR * self.slowest)
        if self.cap is not None:
            derived = min(derived, max(self.cap, 2 * self.slowest))
        return derived


__all__ = ["AutoTimeout", "Suspect", "Verdict", "collective_timeout", "decide", "stall_in_sight", "waits_in_framework"]
