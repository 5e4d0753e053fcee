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
    ControlWatch,
    ErrorKind,
    LiveProtocolError,
    Phase,
    RetryableError,
    classify_error,
    preimport,
    read_control,
    read_rank_status,
    start_generation,
    write_control,
)


def test_control_file_round_trip_and_atomic_replace(tmp_path):
    path = tmp_path / "control.json"
    assert read_control(path) is None
    written = write_control(path, generation=3, action="retry", timeout=7.5, round="r-1")
    control = read_control(path)
    assert control == written
    assert (control.generation, control.action, control.timeout, control.extra) == (3, "retry", 7.5, {"round": "r-1"})
    assert control.store_prefix == "taskd/gen3"
    assert [p.name for p in tmp_path.iterdir()] == ["control.json"]  # no temporary file left behind


@pytest.mark.parametrize("generation, action, timeout, named", [
    (-1, "rejoin", 1.0, "generation"), ("1", "rejoin", 1.0, "generation"), (1, "restart", 1.0, "action"),
    (1, "rejoin", 0, "timeout"),
])
def test_bad_control_values_are_refused_naming_the_field(tmp_path, generation, action, timeout, named):
    with pytest.raises(LiveProtocolError, match=named):
        write_control(tmp_path / "c.json", generation, action, timeout)


def test_malformed_control_file_is_a_clear_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{not json")
    with pytest.raises(LiveProtocolError, match="cannot read control file"):
        read_control(path)
    path.write_text('{"action": "rejoin"}')
    with pytest.raises(LiveProtocolError, match="generation"):
        read_control(path)


def test_control_watch_sees_only_newer_generations_and_times_out(tmp_path):
    path = tmp_path / "c.json"
    watch = ControlWatch(path)
    assert watch.newer(0) is None
    write_control(path, 1)
    assert watch.newer(0).generation == 1
    assert watch.newer(1) is None
    write_control(path, 2, "retry")
    assert watch.newer(1).action == "retry"
    assert watch.wait(2, timeout=0.05) is None


def test_start_generation_reads_the_variable_and_refuses_garbage(monkeypatch):
    monkeypatch.delenv(Var.TASKD_GENERATION, raising=False)
    assert start_generation() == 0
    monkeypatch.setenv(Var.TASKD_GENERATION, "4")
    assert start_generation() == 4
    monkeypatch.setenv(Var.TASKD_GENERATION, "four")
    with pytest.raises(LiveProtocolError, match=Var.TASKD_GENERATION):
        start_generation()


def test_classify_error_tells_in_place_errors_from_script_bugs():
    assert classify_error(RetryableError("x")) == ErrorKind.RETRYABLE
    assert classify_error(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")) \
        == ErrorKind.PEER_LOST
    assert classify_error(RuntimeError("[gloo] Timed out waiting 30000ms for recv operation")) \
        == ErrorKind.COLLECTIVE_TIMEOUT
    assert classify_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert classify_error(KeyError("step")) is None


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


def test_preimport_imports_the_listed_modules_and_skips_missing_ones(monkeypatch):
    monkeypatch.setenv(Var.TASKD_PREIMPORT, "json, no_such_module_here ,colorsys")
    assert preimport() == ["json", "colorsys"]
    assert preimport(["wave"]) == ["wave"] and "wave" in sys.modules


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


@pytest.mark.parametrize(("source", "uses"), [
    ("from taskd.worker.torch import LiveGroup\n", True),
    ("import taskd.worker.torch as t\n", True),
    ("from taskd.worker import torch as tw\n", True),
    ("def main():\n    from taskd.worker.torch import LiveGroup\n", True),
    ("import torch\nimport torch.distributed as dist\n", False),
    ("import mindspore\nfrom taskd import worker\n", False),
    ("from .worker.torch import LiveGroup\n", False),
    ("this is not python(\n", False),
])
def test_auto_store_only_for_scripts_that_import_the_live_binding(tmp_path, source, uses):
    from taskd.rendezvous import uses_live_binding

    script = tmp_path / "train.py"
    script.write_text(source)
    assert uses_live_binding(script) is uses
    assert uses_live_binding(tmp_path / "missing.py") is False


def test_change_strategy_carries_the_generation_every_node_names():
    """taskd's controller puts the round's generation in changeStrategy's extraParams; the agent takes it from
    there (same on every node), never lower than one it named, and counts for itself without one (ClusterD)."""
    import json

    from taskd.agent.live import LiveRanks
    from taskd.agent.ranks import RankTable
    from taskd.controller.events import Signal
    from taskd.controller.hub import to_message
    from taskd.vocabulary import Action, SignalType

    change = Signal(uuid="job-with-dashes-2-7", signal_type=SignalType.CHANGE_STRATEGY,
                    actions=(Action.CHANGE_STRATEGY,), strategy="recover", generation=7, restarts=1)
    # from the signal's typed fields, not from its uuid (a job id may hold dashes)
    assert json.loads(to_message("job-with-dashes", change).extraParams) == {"generation": 7, "restarts": 1}
    stop = Signal(uuid="job-2-5", signal_type=SignalType.STOP_TRAIN, actions=(Action.STOP_TRAIN,), reason="why")
    assert json.loads(to_message("job", stop).extraParams) == {"reason": "why"}

    from taskd.agent.controller_link import Command, Order
    from taskd.agent.launcher_api import MSRUN
    from taskd.client.signals import parse_signal

    def generation(extra_params: str) -> int | None:  # as the agent reads it: a typed field of its Order
        message = to_message("job-with-dashes", change)
        message.extraParams = extra_params
        return Order.of(Command.CHANGE, parse_signal(message)).generation

    live = LiveRanks(RankTable(), MSRUN)
    assert live.next_generation(generation(to_message("job-with-dashes", change).extraParams)) == 7
    assert live.next_generation(generation('{"generation": 3}')) == 8  # generations only grow while the store lives
    assert live.next_generation(generation("")) == 9 and live.next_generation(generation('{"reason": "x"}')) == 10
    assert live.next_generation(generation("not json")) == 11
    assert live.next_generation(generation('{"generation": true}')) == 12
