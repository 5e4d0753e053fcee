"""The framework-neutral live-recovery protocol (taskd.worker.live) and the rendezvous store host.

Rank-side reports are written by a real rank process into a real heartbeat file and read back
with read_rank_status, as the agent will; the store host is a real TCPStore child process.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from support import STARTED, wait_for

from taskd.worker.env import Var
from taskd.worker.heartbeat_file import HeartbeatFile
from taskd.worker.live import (
    ErrorKind,
    Phase,
    read_rank_status,
)

RANK_SCRIPT = textwrap.dedent("""
    import sys
    from taskd.worker.live import ErrorKind, LiveRank, Phase
    live = LiveRank()
    assert live.declare(rejoin=True, retry=False)
    live.collective(True)
    print("in-collective", flush=True)
    sys.stdin.readline()
    live.report_error(ErrorKind.PEER_LOST, 41)
    print("error", flush=True)
    sys.stdin.readline()
    live.joined(5, 41)
    print("joined", flush=True)
    sys.stdin.readline()
""")


def test_rank_reports_reach_the_agent_through_the_heartbeat_file(tmp_path):
    hb = HeartbeatFile(tmp_path / "rank_0.hb").create()
    fresh = read_rank_status(hb)
    assert not fresh.can_rejoin and fresh.generation is None and fresh.errors == 0 and not fresh.torn
    env = {**os.environ, Var.TASKD_HEARTBEAT_FILE: hb.path, Var.TASKD_CONTROL_FILE: str(tmp_path / "c.json")}
    proc = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    STARTED.append(proc)
    try:
        assert proc.stdout.readline().strip() == "in-collective"
        status = read_rank_status(hb.path)
        assert status.can_rejoin and not status.can_retry and status.collective_since is not None
        assert status.heartbeat.pid == proc.pid

        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "error"
        status = read_rank_status(hb)
        assert (status.errors, status.error_kind, status.error_step) == (1, ErrorKind.PEER_LOST, 41)
        assert status.phase == Phase.PAUSED and status.collective_since is None

        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "joined"
        status = read_rank_status(hb)
        assert (status.generation, status.resume_step, status.phase) == (5, 41, Phase.TRAINING)
        assert status.rejoined(5) and not status.rejoined(6)
        assert not status.resumed(5)  # no heartbeat past step 41 yet
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# -- the rendezvous store host -------------------------------------------------------------------------
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")

CLIENT = textwrap.dedent("""
    import os, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=20))
    if sys.argv[1] == "set":
        store.set("weights", "v1")
        print("set", flush=True)
        time.sleep(3600)
    else:
        print(store.get("weights").decode(), flush=True)
""")


@pytest.mark.torch
@needs_torch
def test_store_keeps_serving_after_the_rank_that_wrote_to_it_is_killed():
    from taskd.rendezvous import StoreHost

    with StoreHost.start("127.0.0.1", 0, timeout=60) as host:
        env = {**os.environ, **host.env()}
        assert env[Var.TORCHELASTIC_USE_AGENT_STORE] == "True"
        rank0 = subprocess.Popen([sys.executable, "-c", CLIENT, "set"], env=env, stdout=subprocess.PIPE, text=True)
        STARTED.append(rank0)
        assert rank0.stdout.readline().strip() == "set"
        rank0.send_signal(signal.SIGKILL)
        rank0.wait(timeout=10)
        rank0.stdout.close()
        reader = subprocess.run([sys.executable, "-c", CLIENT, "get"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert reader.stdout.strip() == "v1", reader.stderr
        assert host.alive()
    assert host.popen.returncode is not None  # reaped on close


OWNER = textwrap.dedent("""
    from taskd.rendezvous import StoreHost
    host = StoreHost.start("127.0.0.1", 0, timeout=60)
    print(host.pid, flush=True)
    import time
    time.sleep(3600)
""")


@pytest.mark.torch
@needs_torch
def test_store_dies_with_its_owner():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    STARTED.append(owner)
    store_pid = int(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    owner.stdout.close()

    def gone() -> bool:
        try:
            with open(f"/proc/{store_pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] == "Z"  # a zombie until init reaps it
        except FileNotFoundError:
            return True

    wait_for(gone, 20, "the store child to die with its owner")


@pytest.mark.torch
@needs_torch
def test_store_start_failure_names_the_cause():
    from taskd.rendezvous import StoreHost, StoreHostError

    with StoreHost.start("127.0.0.1", 0, timeout=60) as host:
        with pytest.raises(StoreHostError, match=f"port {host.port} is already in use.*--master-port"):
            StoreHost.start("127.0.0.1", host.port, timeout=60)
    with pytest.raises(StoreHostError, match="0..65535"):
        StoreHost.start("127.0.0.1", 70000)


@pytest.mark.torch
@needs_torch
def test_store_that_cannot_start_says_why(tmp_path):
    from taskd.rendezvous import StoreHost, StoreHostError

    no_site = tmp_path / "python-no-site"  # the ranks' interpreter without site-packages: no torch
    no_site.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_site.chmod(0o755)
    with pytest.raises(StoreHostError, match=r"(?s)exited \(1\): Traceback.*No module named 'torch'"):
        StoreHost.start("127.0.0.1", 0, timeout=60, python=str(no_site))


