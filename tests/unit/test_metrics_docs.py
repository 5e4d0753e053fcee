"""docs/operations.md and the Grafana example name exactly the metrics the controller exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
from taskd.controller.metrics import ControllerMetrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _exported() -> set[str]:
    metrics = ControllerMetrics(lambda: [], lambda: 0)
    out = set()
    for family in metrics.registry.collect():
        out.add(family.name + ("_total" if family.type == "counter" else ""))
    return out


def _node_exported() -> set[str]:
    from taskd.agent.watches.metrics import NodeMetrics

    metrics = NodeMetrics()
    metrics.publish([], 0, 0)
    names = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    return names | {"taskd_rank_step", "taskd_rank_heartbeat_age_seconds", "taskd_rank_step_seconds",
                     "taskd_rank_compute_seconds"}  # per rank


def test_the_operations_doc_lists_every_exported_metric_and_no_other() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(taskd_[a-z_]+)` \|", text, re.M))
    assert documented == _exported() | _node_exported()


def test_the_grafana_dashboard_queries_only_exported_metrics() -> None:
    board = json.loads((ROOT / "examples" / "grafana" / "taskd-controller.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for e in exprs for name in re.findall(r"taskd_[a-z_]+", e)}
    assert used and used <= _exported()
