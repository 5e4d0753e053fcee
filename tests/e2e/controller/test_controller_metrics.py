"""`--metrics-listen`: Prometheus metrics of a real controller, scraped over HTTP and parsed with
prometheus_client's own parser, after a real round over gRPC (issue 21, item 6)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from support.scripted_agent import ScriptedAgent

from taskd.controller.config import ConfigError
from taskd.controller.service.server import ControllerConfig, EmbeddedController

parser = pytest.importorskip("prometheus_client.parser")
ROOT = Path(__file__).resolve().parents[3]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_a_recovered_round_a_refused_call_and_the_job_table_show_in_the_metrics() -> None:
    token = secrets.token_urlsafe(32)
    cfg = ControllerConfig(listen="127.0.0.1:0", state_path=":memory:", token=token,
                           metrics_listen="127.0.0.1:0", keepalive_interval=0.5)
    with EmbeddedController(cfg) as ctl:
        assert ctl.server is not None
        port = ctl.server.metrics_port
        agent = ScriptedAgent(ctl.address, "m1", ranks_per_node=2, token=token).join(max_restarts=3)
        stranger = ScriptedAgent(ctl.address, "m1", token="x" * 43)
        spare = ScriptedAgent(ctl.address, "m1", ranks_per_node=2, token=token, host="spare", pid=4242)
        spare.info.standby = True
        try:
            spare.join()  # a standby's stream counts among the streams open
            with pytest.raises(grpc.RpcError) as refused:
                stranger.health()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert agent.fault({1: 1}).code == 0
            agent.expect("stopTrain")
            assert agent.stop_complete(faults={1: 1}).code == 0
            agent.expect("globalFault")
            assert agent.strategies(["recover", "job-rescheduling"], faults={1: 1}).code == 0
            agent.expect("changeStrategy", "recover")
            assert agent.status("recover").code == 0
            got = scrape(port)
        finally:
            stranger.close()
            spare.close()
            agent.close()
    assert got[("taskd_jobs", (("state", "RUNNING"),))] == 1
    assert got[("taskd_job_restarts_used", (("job", "m1"),))] == 1
    assert got[("taskd_job_restarts_max", (("job", "m1"),))] == 3
    assert got[("taskd_streams_open", ())] == 2  # the node's and the standby's
    assert got[("taskd_rounds_total", (("outcome", "recovered"), ("strategy", "recover")))] == 1
    assert got[("taskd_strategies_chosen_total", (("strategy", "recover"),))] == 1
    hist = (("le", "+Inf"), ("outcome", "recovered"), ("strategy", "recover"))
    assert got[("taskd_round_duration_seconds_bucket", hist)] == 1
    assert 0 < got[("taskd_round_duration_seconds_sum", (("outcome", "recovered"), ("strategy", "recover")))] < 30
    assert got[("taskd_events_total", (("kind", "round_started"),))] == 1
    assert got[("taskd_refused_total", (("reason", "auth"),))] >= 1
    assert got.get(("taskd_store_errors_total", ()), 0) == 0


def test_a_bad_metrics_address_is_refused_where_the_config_is_built() -> None:
    with pytest.raises(ConfigError, match="--metrics-listen"):
        ControllerConfig(listen="127.0.0.1:0", metrics_listen="host:notaport")
    proc = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state", ":memory:",
                           "--metrics-listen", "[::1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "--metrics-listen" in proc.stderr, proc.stderr
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        busy = subprocess.run([sys.executable, "-m", "taskd", "server", "--listen", "127.0.0.1:0", "--state",
                               ":memory:", "--metrics-listen", f"127.0.0.1:{port}"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
    assert busy.returncode != 0, busy.stderr
    assert f"--metrics-listen 127.0.0.1:{port}: cannot listen there" in busy.stderr and "free port" in busy.stderr
