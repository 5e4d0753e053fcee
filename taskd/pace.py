"""Stragglers: which rank makes the others wait (issue 21, item 5). Pure: no clock, no I/O.

In data-parallel training every rank steps at the pace of the slowest, so step times cannot name it. What
differs is the time a rank spends *outside* its collectives between two heartbeats (its compute time,
heartbeat file bytes 232-247): the slow rank computes longer, its peers wait longer. The agent keeps a
window of each rank's recent compute seconds per step (`PaceWindow`); the judge (`StragglerJudge`) compares
each rank with the median of its peers, the job's other ranks, and says when a rank becomes a straggler,
when its ratio changes, and when it is one no more. The controller judges the whole job from every
agent's reports; an agent without a controller that can (degraded, ClusterD) judges its node alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW = 10
"""Heartbeat intervals a rank's recent pace averages (the newest `WINDOW` the agent saw)."""

MIN_INTERVALS = 3
"""A rank is judged once its window holds this many intervals (a rank just started or restarted is not)."""

CHANGE = 0.25
"""A straggler is reported again when the time it costs its peers per step (its compute seconds over their
median) moved by this fraction of what it was when last reported. Not the ratio: with peers that compute
almost nothing outside collectives (backward counts as waiting, taskd/worker/torch_mark.py) a rank 20x as slow
swings between 16x and 26x on a millisecond of noise in their median, while the seconds it costs stay put."""

CLEAR = 0.8
"""A straggler is one no more when its ratio falls under `CLEAR` x the factor (hysteresis: no flapping)."""

MIN_FACTOR = 1.0


def check_factor(value: float | None) -> str:
    """"" for a usable straggler factor (None: off), else what is wrong."""
    if value is None:
        return ""
    if not value > MIN_FACTOR or value != value or value == float("inf"):
        return f"must be a number above {MIN_FACTOR:g} (a rank this many times slower than its peers), got {value!r}"
    return ""


class PaceWindow:
    """One rank's recent compute seconds per heartbeat interval, from successive readings of its heartbeat
    file's running sums (compute seconds, intervals). A new process (pid) starts a new window."""

    def __init__(self, size: int = WINDOW) -> None:
        self.size = size
        self.pid = 0
        self._samples: deque[tuple[int, float]] = deque()  # (intervals, compute seconds), oldest first

    def observe(self, pid: int, compute: float, intervals: int) -> None:
        if pid != self.pid or (self._samples and intervals < self._samples[-1][0]):
            self.pid = pid
            self._samples.clear()
        if intervals <= 0 or (self._samples and intervals == self._samples[-1][0]):
            return
        self._samples.append((intervals, compute))
        while len(self._samples) > 2 and intervals - self._samples[1][0] >= self.size:
            self._samples.popleft()

    @property
    def intervals(self) -> int:
        """Intervals the window spans."""
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) > 1 else 0

    def seconds(self) -> float | None:
        """Compute seconds per interval over the window; None until it spans `MIN_INTERVALS`."""
        n = self.intervals
        if n < MIN_INTERVALS:
            return None
        return max(0.0, self._samples[-1][1] - self._samples[0][1]) / n


@dataclass(frozen=True)
class RankPace:
    """One rank's recent pace, as an agent reports it."""

    rank: int
    host: str
    seconds: float  # compute seconds per step, recent
    intervals: int  # how many steps that averages


@dataclass(frozen=True)
class Verdict:
    """A change worth reporting: a rank became a straggler (or its ratio moved), or is one no more."""

    rank: int
    host: str
    ratio: float  # its compute time / the median of its peers'
    seconds: float
    median: float
    cleared: bool = False

    def describe(self, factor: float) -> str:
        if self.cleared:
            return (f"rank {self.rank} on {self.host or '?'} is no longer a straggler: {self.ratio:.2f}x the median "
                    f"of its peers ({self.seconds:.3f}s vs {self.median:.3f}s of compute per step)")
        return (f"straggler: rank {self.rank} on {self.host or '?'} computes {self.ratio:.2f}x as long per step as "
                f"the median of its peers ({self.seconds:.3f}s vs {self.median:.3f}s outside collectives; "
                f"--straggler-factor {factor:g})")


def peer_medians(values: list[float]) -> list[float]:
    """For each value, the median of the others (O(n log n)); a single value has no peers (nan)."""
    n = len(values)
    if n < 2:
        return [float("nan")] * n
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    half = (n - 1) // 2  # the others are n - 1 values: `ranked` without the one at `position`
    out = [0.0] * n
    for position, index in enumerate(order):
        upper = ranked[half + (half >= position)]  # the half-th of the others
        if (n - 1) % 2:
            out[index] = upper
        else:
            lower = ranked[half - 1 + (half - 1 >= position)]
            out[index] = (lower + upper) / 2
    return out


class StragglerJudge:
    """Which ranks are stragglers, with hysteresis: a verdict when a rank becomes one, when what it costs its
    peers per step moves by `CHANGE`, and when its ratio falls under `CLEAR` x `factor`; nothing while it stays
    as it was."""

    def __init__(self, factor: float) -> None:
        if why := check_factor(factor):
            raise ValueError(f"straggler factor {why}")
        self.factor = factor
        self.reported: dict[int, float] = {}  # rank -> the seconds per step it cost its peers when last reported

    def judge(self, paces: Iterable[RankPace]) -> list[Verdict]:
        """Verdicts for the ranks whose standing changed; ranks not in `paces` are forgotten silently."""
        paces = [p for p in paces if p.intervals >= MIN_INTERVALS]
        present = {p.rank for p in paces}
        for rank in [r for r in self.reported if r not in present]:
            del self.reported[rank]
        out = []
        for pace, median in zip(paces, peer_medians([p.seconds for p in paces]), strict=True):
            if not median > 0:  # no peers, or peers that spend no time outside collectives
                continue
            ratio = pace.seconds / median
            excess = pace.seconds - median
            last = self.reported.get(pace.rank)
            if ratio >= self.factor:
                if last is None or abs(excess - last) >= CHANGE * last:
                    self.reported[pace.rank] = excess
                    out.append(Verdict(pace.rank, pace.host, ratio, pace.seconds, median))
            elif last is not None and ratio < CLEAR * self.factor:
                del self.reported[pace.rank]
                out.append(Verdict(pace.rank, pace.host, ratio, pace.seconds, median, cleared=True))
        return out

    def copy(self) -> StragglerJudge:
        judge = StragglerJudge(self.factor)
        judge.reported = dict(self.reported)
        return judge
