"""A straggler in a real DDP job (LiveGroup, gloo, 2 ranks): rank 1 sleeps longer per step, before its forward
pass (outside collectives). The console names it, its host and the ratio; the embedded controller's history
and `taskd status`'s view (read through the run's locator, as `taskd status` does) show the event."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from support import STARTED, wait_for  # noqa: E402

from taskd.controller.status_view import fetch_jobs, render_text  # noqa: E402
from taskd.proto import taskd_pb2  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
FACTOR = 2.0
LINE = re.compile(r"straggler: rank (\d+) on (\S+) computes ([0-9.]+)x as long per step")


def test_a_rank_slower_per_step_is_reported_as_a_straggler(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_"))}
    env.update(OMP_NUM_THREADS="1", XDG_RUNTIME_DIR=str(runtime))
    argv = [sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nproc-per-node", "2",
            "--job-id", "slow", "--straggler-factor", str(FACTOR), "--straggler-interval", "0.5", str(EXAMPLE),
            "--hidden", "32", "--layers", "1", "--steps", "50", "--ckpt-every", "0", "--slow", "1:0.05",
            "--pg-timeout", "30", "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]
    log = tmp_path / "console.log"
    run = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    STARTED.append(run)
    try:
        wait_for(lambda: LINE.search(log.read_text()) or run.poll() is not None, 60, "the straggler line")
        [locator] = (runtime / "taskd").glob("*.json")  # what `taskd status` reads to find a standalone run
        found = json.loads(locator.read_text())
        job = fetch_jobs(found["address"], "slow", token=found["token"]).jobs[0]
        assert run.wait(timeout=60) == 0, log.read_text()[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    console = log.read_text()
    lines = LINE.findall(console)
    assert {rank for rank, _, _ in lines} == {"1"}, console[-4000:]  # rank 0 waits for it: never named
    rank, host, ratio = lines[0]
    assert host == socket.gethostname() and float(ratio) >= FACTOR
    assert len(lines) <= 2, lines  # reported once (again only if what it costs moved by a quarter)
    [event] = [json.loads(e.detail) for e in job.events if e.kind == "straggler"]
    assert (event["rank"], event["node_rank"], event["host"]) == (1, 0, host) and event["ratio"] >= FACTOR
    assert event["compute_seconds"] >= 0.05 > event["median_seconds"]
    [standing] = job.stragglers
    assert standing.rank == 1 and standing.host == host
    assert f"rank 1 (node 0, {host}): " in render_text(taskd_pb2.JobList(jobs=[job]))
