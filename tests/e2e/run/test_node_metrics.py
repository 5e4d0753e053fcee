"""`taskd run --metrics-listen`: a node's Prometheus metrics, scraped from a real job over HTTP while it trains
and after a rank crashed, parsed with prometheus_client's parser (issue 21, item 6, the node side)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from support import free_port, wait_for
from support.run import EXAMPLE, taskd_run

parser = pytest.importorskip("prometheus_client.parser")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_a_nodes_ranks_steps_pace_and_restarts_are_scraped_from_a_training_job(tmp_path: Path) -> None:
    port = free_port()
    proc = taskd_run(["--nproc-per-node", "2", "--metrics-listen", f"127.0.0.1:{port}", str(EXAMPLE), "--steps",
                      "300", "--ckpt-every", "20", "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
                      "--step-sleep", "0.05", "--crash-once-at-step", "30"], tmp_path / "run.log")
    try:
        def crashed_and_back() -> dict:
            got = scrape(port)
            restarted = got.get(("taskd_rank_starts_total", (("rank", "1"),)), 0) >= 2
            return got if restarted and got.get(("taskd_rank_step", (("rank", "1"),)), 0) > 30 else {}

        got = wait_for(crashed_and_back, 90, "rank 1 to crash, restart and train past step 30 in the metrics")
        assert got[("taskd_node_ranks", (("state", "running"),))] == 2
        assert got[("taskd_node_faults_total", ())] == 1 and got[("taskd_node_recoveries_total", ())] == 1
        assert got[("taskd_rank_starts_total", (("rank", "0"),))] == 1
        assert 0.04 < got[("taskd_rank_step_seconds", (("rank", "0"),))] < 1.0  # --step-sleep 0.05
        # no collectives marked (independent ranks): all of a step is the rank's own compute
        assert 0.04 < got[("taskd_rank_compute_seconds", (("rank", "0"),))] < 1.0
        assert 0 <= got[("taskd_rank_heartbeat_age_seconds", (("rank", "0"),))] < 5
        assert proc.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert scrape(port) == {}  # the exporter went with the run


def test_a_metrics_port_in_use_stops_the_run_before_any_rank_with_what_to_do(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = taskd_run(["--metrics-listen", f"127.0.0.1:{port}", str(EXAMPLE), "--steps", "3", "--ckpt-every", "3",
                          "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")], tmp_path / "run.log")
        assert proc.wait(timeout=60) == 2
    log = (tmp_path / "run.log").read_text()
    assert f"--metrics-listen 127.0.0.1:{port}: cannot listen there" in log and "give a free port" in log, log
    assert "Traceback" not in log and "started" not in log, log
