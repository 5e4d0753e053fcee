"""Prometheus metrics of one node (`taskd run --metrics-listen HOST[:PORT]`, issue 21 item 6).

Through `prometheus_client` (the optional `[metrics]` extra). The agent's own thread takes a
`NodeSample` at every sweep (`sample`); the exporter's thread only reads the newest one, which is
replaced whole, so the two never share anything mutable. Per-rank step time is measured between two
samples whose heartbeats name different steps. docs/operations.md lists the names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from taskd.address import parse_host_port
from taskd.pace import PaceWindow

log = logging.getLogger(__name__)

METRICS_PORT = 9465  # a node's, beside the controller's 9464 (taskd/controller/config.py)


def check_listen(text: str) -> str:
    """"" for a usable HOST[:PORT], else what is wrong (AgentConfig refuses it where it is built)."""
    try:
        parse_host_port(text, METRICS_PORT, what="--metrics-listen", forms="HOST[:PORT]")
    except ValueError as exc:
        return str(exc)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return "needs prometheus_client: pip install 'taskd[metrics]'"
    return ""


@dataclass(frozen=True)
class RankSample:
    global_rank: int
    state: str  # RankState's value: running, failed, ...
    step: int | None  # of its last heartbeat
    heartbeat_age: float | None  # seconds since its last heartbeat (None: none yet)
    step_seconds: float | None  # seconds per step between the last two samples that saw its step advance
    starts: int  # processes this agent has seen for the rank (a restart adds one)
    compute_seconds: float | None = None  # recent seconds per heartbeat interval outside collectives (taskd/pace.py)


@dataclass(frozen=True)
class NodeSample:
    ranks: tuple[RankSample, ...] = ()
    faults: int = 0
    recoveries: int = 0


class StepClock:
    """Seconds per step of each rank, from successive (step, heartbeat time) pairs; agent thread only."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, int, float]] = {}  # global rank -> (pid, step, heartbeat time)
        self._rate: dict[int, float] = {}
        self._pids: dict[int, set[int]] = {}
        self._compute: dict[int, PaceWindow] = {}

    def compute(self, global_rank: int, pid: int, state: Any) -> float | None:
        """Recent compute seconds per step of the rank (its heartbeat file's sums), None until measured."""
        if state is None or not state.compute_intervals:
            return None
        window = self._compute.setdefault(global_rank, PaceWindow())
        window.observe(pid, state.compute, state.compute_intervals)
        return window.seconds()

    def starts(self, global_rank: int) -> int:
        return len(self._pids.get(global_rank, ()))

    def observe(self, global_rank: int, pid: int, step: int | None, beat: float) -> float | None:
        if pid:
            self._pids.setdefault(global_rank, set()).add(pid)
        if step is None or not beat:
            return self._rate.get(global_rank)
        last = self._last.get(global_rank)
        if last is not None and last[0] == pid and step > last[1] and beat > last[2]:
            self._rate[global_rank] = (beat - last[2]) / (step - last[1])
        if last is None or last[0] != pid or step != last[1]:
            self._last[global_rank] = (pid, step, beat)
        return self._rate.get(global_rank)


class NodeMetrics:
    """The registry and its exporter; `publish(sample)` from the agent's thread, scraped from the exporter's."""

    def __init__(self) -> None:
        import prometheus_client as pc

        self.registry = pc.CollectorRegistry()
        self.registry.register(_Collector(self))
        self.clock = StepClock()
        self.latest = NodeSample()
        self._server: Any = None

    def publish(self, ranks: Iterable[RankSample], faults: int, recoveries: int) -> None:
        self.latest = NodeSample(tuple(ranks), faults, recoveries)

    def serve(self, listen: str) -> int:
        """Start the exporter (a daemon thread); returns the bound port."""
        import prometheus_client as pc

        host, port = parse_host_port(listen, METRICS_PORT, what="--metrics-listen", forms="HOST[:PORT]")
        self._server, _ = pc.start_http_server(port, addr=host, registry=self.registry)
        bound = int(self._server.server_port)
        log.info("this node's Prometheus metrics at http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def sample_ranks(ranks: Iterable[Any], heartbeat: Callable[[Any], Any], clock: StepClock,
                 now: float | None = None) -> list[RankSample]:
    """One RankSample per rank of the table (`heartbeat(rank)` -> its HeartbeatState or None)."""
    now = time.time() if now is None else now
    out = []
    for rank in ranks:
        state = heartbeat(rank) if rank.pid is not None else None
        beat = state.time if state is not None and state.time else 0.0
        step = state.step if state is not None else None
        rate = clock.observe(rank.global_rank, rank.pid or 0, step, beat)
        out.append(RankSample(rank.global_rank, rank.state.value, step, now - beat if beat else None, rate,
                              clock.starts(rank.global_rank), clock.compute(rank.global_rank, rank.pid or 0, state)))
    return out


class _Collector:
    def __init__(self, metrics: NodeMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sample = self._m.latest
        states = GaugeMetricFamily("taskd_node_ranks", "This node's ranks, by state", labels=["state"])
        counts: dict[str, int] = {}
        for r in sample.ranks:
            counts[r.state] = counts.get(r.state, 0) + 1
        for state, n in sorted(counts.items()):
            states.add_metric([state], n)
        yield states
        step = GaugeMetricFamily("taskd_rank_step", "The step of a rank's last heartbeat", labels=["rank"])
        age = GaugeMetricFamily("taskd_rank_heartbeat_age_seconds", "Seconds since a rank's last heartbeat",
                                labels=["rank"])
        pace = GaugeMetricFamily("taskd_rank_step_seconds", "A rank's recent seconds per step, from its heartbeats",
                                 labels=["rank"])
        compute = GaugeMetricFamily("taskd_rank_compute_seconds", "A rank's recent seconds per step outside "
                                    "collectives (what --straggler-factor compares)", labels=["rank"])
        starts = CounterMetricFamily("taskd_rank_starts", "Processes started for a rank (a restart adds one)",
                                     labels=["rank"])
        for r in sample.ranks:
            label = [str(r.global_rank)]
            if r.step is not None:
                step.add_metric(label, r.step)
            if r.heartbeat_age is not None:
                age.add_metric(label, r.heartbeat_age)
            if r.step_seconds is not None:
                pace.add_metric(label, r.step_seconds)
            if r.compute_seconds is not None:
                compute.add_metric(label, r.compute_seconds)
            starts.add_metric(label, r.starts)
        yield from (step, age, pace, compute, starts)
        yield CounterMetricFamily("taskd_node_faults", "Faults this node's agent saw", value=sample.faults)
        yield CounterMetricFamily("taskd_node_recoveries", "Recoveries this node's agent carried out",
                                  value=sample.recoveries)
