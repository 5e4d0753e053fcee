"""The tests of tests/e2e/worker/test_live_protocol.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: The framework-neutral live-recovery protocol
(taskd.worker.live) and the rendezvous store host.
"""

from __future__ import annotations

import sys

import pytest

from taskd.worker.env import Var
from taskd.worker.live import (
    ControlWatch,
    ErrorKind,
    LiveProtocolError,
    RetryableError,
    classify_error,
    preimport,
    read_control,
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


def test_an_error_no_collective_raised_is_the_scripts_whatever_its_type_and_text():
    """Issue 32 F1 (issue 21 D1 before it): a TimeoutError or ConnectionResetError of the script's own (a remote
    read in a module's forward) made every rank pause 2 minutes for a rebuild; the binding's word on where it was
    raised decides now, not its traceback's files or its words."""
    for exc, kind in ((TimeoutError("read timed out"), ErrorKind.COLLECTIVE_TIMEOUT),
                      (ConnectionResetError("connection reset by peer"), ErrorKind.PEER_LOST),
                      (RuntimeError("[gloo] Connection closed by peer"), ErrorKind.PEER_LOST)):
        assert classify_error(exc, from_collective=True) == kind
        assert classify_error(exc, from_collective=False) is None
        assert classify_error(exc) == kind  # no binding's word: type and text
    dist_error = type("DistBackendError", (RuntimeError,), {})("NCCL error")
    assert classify_error(dist_error, from_collective=False) == ErrorKind.PEER_LOST  # only torch.distributed's
    assert classify_error(RetryableError("redo"), from_collective=False) == ErrorKind.RETRYABLE
    # a collective's error that reads like no peer's fault (a usage error) still propagates
    assert classify_error(ValueError("Default process group has not been initialized"), from_collective=True) is None
    assert classify_error(RuntimeError("Expected to have finished reduction"), from_collective=True) is None


def test_preimport_imports_the_listed_modules_and_skips_missing_ones(monkeypatch):
    monkeypatch.setenv(Var.TASKD_PREIMPORT, "json, no_such_module_here ,colorsys")
    assert preimport() == ["json", "colorsys"]
    assert preimport(["wave"]) == ["wave"] and "wave" in sys.modules


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

    from taskd.agent.ranks.live import LiveRanks
    from taskd.agent.ranks.table import RankTable
    from taskd.controller.machine.events import Signal
    from taskd.controller.service.hub import to_message
    from taskd.vocabulary import Action, SignalType

    change = Signal(uuid="job-with-dashes-2-7", signal_type=SignalType.CHANGE_STRATEGY,
                    actions=(Action.CHANGE_STRATEGY,), strategy="recover", generation=7, restarts=1, round=2)
    # from the signal's typed fields, not from its uuid (a job id may hold dashes)
    assert json.loads(to_message("job-with-dashes", change).extraParams) == {"generation": 7, "restarts": 1,
                                                                              "round": 2}
    stop = Signal(uuid="job-2-5", signal_type=SignalType.STOP_TRAIN, actions=(Action.STOP_TRAIN,), reason="why")
    assert json.loads(to_message("job", stop).extraParams) == {"reason": "why"}

    from taskd.agent.link.orders import Command, Order
    from taskd.agent.ranks.launcher import MSRUN
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
