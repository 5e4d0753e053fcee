"""Prometheus metrics of `taskd server --metrics-listen HOST:PORT` (issue 21, item 6).

Through `prometheus_client` (the optional `[metrics]` extra), never a hand-written exposition
format. Two kinds of figures, kept apart so that neither needs a lock against the event loop:

- counters and the round-duration histogram are incremented on the loop, from the records every
  stored change publishes (`observe`) and from the guard's and the connection watch's refusals;
- gauges (jobs by state, restarts used, streams open) are read when Prometheus scrapes, in the
  exporter's thread, from a copy of the job table (`list(dict.values())` copies under the GIL).

No metric is labelled by anything a client chooses except the job id of the per-job gauges, which
`--max-jobs` bounds. docs/operations.md lists every name.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Any

log = logging.getLogger(__name__)

EXTRA_HINT = "--metrics-listen needs prometheus_client: pip install 'taskd[metrics]'"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def prometheus() -> Any:
    """The prometheus_client module, or ImportError saying how to install it."""
    try:
        import prometheus_client
    except ImportError:
        raise ImportError(EXTRA_HINT) from None
    return prometheus_client


class ControllerMetrics:
    """One registry per controller; `observe` is the core's observer, `refused` the guard's and watch's."""

    def __init__(self, jobs: Callable[[], Iterable[Any]], streams: Callable[[], int]) -> None:
        pc = prometheus()
        self.registry = pc.CollectorRegistry()
        self.jobs = jobs  # read at scrape time (_Gauges)
        self.streams = streams
        r = self.registry
        self.events = pc.Counter("taskd_events", "History records the controller stored, by kind", ["kind"],
                                 registry=r)
        self.rounds = pc.Counter("taskd_rounds", "Recovery rounds ended, by the strategy they ended with and "
                                 "their outcome", ["strategy", "outcome"], registry=r)
        self.round_seconds = pc.Histogram("taskd_round_duration_seconds", "From a round's first fault report to "
                                          "its end (recovered: every agent reported its strategy carried out)",
                                          ["strategy", "outcome"], buckets=DURATION_BUCKETS, registry=r)
        self.strategies = pc.Counter("taskd_strategies_chosen", "Strategies the controller chose", ["strategy"],
                                     registry=r)
        self.jobs_ended = pc.Counter("taskd_jobs_ended", "Jobs that reached a final state", ["state"], registry=r)
        self.node_losses = pc.Counter("taskd_node_losses", "Nodes declared lost (their agent gone)", registry=r)
        self.migrations = pc.Counter("taskd_migrations", "Planned migrations ended, by what asked for them "
                                     "(`taskd migrate`, straggler) and their outcome (migrated, failed)",
                                     ["trigger", "outcome"], registry=r)
        self.refusals = pc.Counter("taskd_refused", "Calls refused and connections closed, by reason", ["reason"],
                                   registry=r)
        self.store_errors = pc.Counter("taskd_store_errors", "Changes the state file could not take (nothing "
                                       "applied, the caller answered STORAGE_ERROR)", registry=r)
        r.register(_Gauges(self))

    def observe(self, records: Iterable[Any]) -> None:
        """The records of one stored change (`events.Record`: kind, round, detail)."""
        for rec in records:
            kind, detail = rec.kind, rec.detail
            self.events.labels(kind).inc()
            if kind == "round_ended":
                strategy, outcome = str(detail.get("strategy") or "none"), str(detail.get("outcome", ""))
                self.rounds.labels(strategy, outcome).inc()
                duration = detail.get("duration")
                if isinstance(duration, (int, float)) and duration >= 0:
                    self.round_seconds.labels(strategy, outcome).observe(duration)
            elif kind == "strategy_chosen":
                self.strategies.labels(str(detail.get("strategy", ""))).inc()
            elif kind in ("job_succeeded", "job_failed"):
                self.jobs_ended.labels(kind[4:].upper()).inc()
            elif kind == "node_lost":
                self.node_losses.inc()
            elif kind in ("migrated", "migration_failed"):
                self.migrations.labels(str(detail.get("trigger", "")), "migrated" if kind == "migrated" else
                                       "failed").inc()

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def store_failed(self) -> None:
        self.store_errors.inc()

    def counting(self, note: Callable[..., bool]) -> Callable[..., bool]:
        """A `RateLimitedLog` that also counts each refusal by its kind (the log line stays rate-limited)."""
        def counted(kind: str, msg: str, *args: object) -> bool:
            self.refused(kind)
            return note(kind, msg, *args)
        return counted

    def serve(self, host: str, port: int) -> Any:
        """Start the exporter's HTTP server (a daemon thread); returns it, to `shutdown()` at stop."""
        server, _thread = prometheus().start_http_server(port, addr=host, registry=self.registry)
        return server


class _Gauges:
    """Figures read at scrape time from the job table."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Any]:
        return []  # unchecked: the names are only known at collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        jobs = list(self._m.jobs())
        by_state = GaugeMetricFamily("taskd_jobs", "Jobs the controller holds, by state", labels=["state"])
        for state, n in sorted(Tally(j.state.name for j in jobs).items()):
            by_state.add_metric([state], n)
        yield by_state
        used = GaugeMetricFamily("taskd_job_restarts_used", "Restarts a job has used", labels=["job"])
        budget = GaugeMetricFamily("taskd_job_restarts_max", "Restarts a job may use", labels=["job"])
        for j in jobs:
            used.add_metric([j.job_id], j.restarts)
            budget.add_metric([j.job_id], j.max_restarts)
        yield used
        yield budget
        stragglers = GaugeMetricFamily("taskd_job_stragglers", "A job's ranks judged stragglers now "
                                       "(--straggler-factor)", labels=["job"])
        for j in jobs:
            board = getattr(j, "paces", None)
            if board is not None:
                stragglers.add_metric([j.job_id], len(board.current))
        yield stragglers
        lag = GaugeMetricFamily("taskd_snapshot_replication_lag_seconds", "How far a node's buddy's copy is behind "
                                "(issue 33): the last copy's publish to its acknowledgement, or, while the buddy lacks "
                                "a newer step, the time since that step's publish (grows while replication stalls)",
                                labels=["job", "node"])
        behind = GaugeMetricFamily("taskd_snapshot_replication_steps_behind", "A node's newest snapshot step minus "
                                   "the newest its buddy holds", labels=["job", "node"])
        for j in jobs:
            board = getattr(j, "replicas", None)
            for node, r in sorted(board.reports.items()) if board is not None else ():
                lag.add_metric([j.job_id, str(node)], r.lag)
                behind.add_metric([j.job_id, str(node)], max(0, r.newest - r.replicated))
        yield lag
        yield behind
        yield GaugeMetricFamily("taskd_streams_open", "Agents' signal streams open now", value=self._m.streams())
