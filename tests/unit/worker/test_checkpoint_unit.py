"""The tests of tests/e2e/worker/test_checkpoint.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: CheckpointManager: atomic saves, pruning, and never
returning a damaged checkpoint.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from taskd.worker import CheckpointManager, CorruptCheckpoint
from taskd.worker.checkpoint import HEADER_SIZE, WRITER_NICENESS, hold_background_saves, release_background_saves

HELD = 60.0  # seconds: longer than any test, which releases the hold itself


@pytest.fixture(autouse=True)
def no_hold_outlives_its_test() -> Iterator[None]:
    """A test that fails while it holds the saves must not leave the next tests' saves paused for a minute."""
    yield
    release_background_saves()


def test_keeps_last_k(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 6):
        ckpt.save({"step": step}, step)
    assert ckpt.steps() == [4, 5]
    assert ckpt.load_latest() == ({"step": 5}, 5)
    assert ckpt.load(4) == {"step": 4}


def test_saving_a_step_again_replaces_it(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep=3)
    ckpt.save("first", 3)
    ckpt.save("second", 3)
    assert ckpt.steps() == [3]
    assert ckpt.load_latest() == ("second", 3)


def test_truncated_file_is_skipped_with_warning(tmp_path, caplog):
    ckpt = CheckpointManager(tmp_path, keep=3)
    ckpt.save({"step": 1}, 1)
    path = ckpt.save({"step": 2, "blob": b"x" * 1000}, 2)
    with open(path, "r+b") as f:
        f.truncate(HEADER_SIZE + 100)
    with pytest.raises(CorruptCheckpoint):
        ckpt.load(2)
    with caplog.at_level(logging.WARNING, logger="taskd.worker"):
        assert ckpt.load_latest() == ({"step": 1}, 1)
    assert "step 2" in caplog.text and "truncated" in caplog.text
    assert os.path.exists(path + ".corrupt") and ckpt.steps() == [1]


def test_damaged_byte_and_foreign_file_are_skipped(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep=5)
    ckpt.save({"step": 1}, 1)
    path = ckpt.save({"step": 2, "blob": b"y" * 1000}, 2)
    with open(path, "r+b") as f:
        f.seek(HEADER_SIZE + 500)
        f.write(b"z")
    with open(ckpt.path_for(3), "wb") as f:
        f.write(b"not a checkpoint at all" * 10)
    open(ckpt.path_for(4), "wb").close()  # empty
    assert ckpt.latest_step() == 1
    assert ckpt.load_latest() == ({"step": 1}, 1)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep=0)
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, serializer="nope")
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, prefix="a/b")
    ckpt = CheckpointManager(tmp_path)
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError):
            ckpt.save({}, bad)


class JsonSerializer:
    name = "json"

    def dump(self, state, out):
        out.write(json.dumps(state).encode())

    def load(self, src):
        return json.loads(src.read())


def test_custom_serializer_is_recorded_in_the_file(tmp_path):
    CheckpointManager(tmp_path, serializer=JsonSerializer()).save({"a": [1, 2]}, 3)
    with open(CheckpointManager(tmp_path).path_for(3), "rb") as f:
        assert b'{"a": [1, 2]}' in f.read()
    # a manager configured with pickle still reads it: the file names its serializer
    assert CheckpointManager(tmp_path).load_latest() == ({"a": [1, 2]}, 3)


def test_failed_save_leaves_nothing(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    ckpt.save({"ok": 1}, 1)
    with pytest.raises((TypeError, AttributeError, __import__("pickle").PicklingError)):
        ckpt.save({"bad": lambda: None}, 2)  # cannot be pickled
    assert ckpt.steps() == [1] and [n for n in os.listdir(tmp_path) if n.startswith(".")] == []



def _writer_thread() -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name.startswith("taskd-checkpoint"))


def test_save_async_writes_the_state_as_it_was_at_the_call(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    state = {"weights": [1.0, 2.0], "step": 5}
    hold_background_saves(HELD)  # the write then surely happens after the state has changed
    future = ckpt.save_async(state, 5)
    state["weights"].append(3.0)  # the next training step changes the state in place while the file is written
    state["step"] = 6
    assert ckpt.steps() == [] and not future.done()  # not on disk before the write has finished
    if sys.platform.startswith("linux"):  # the writer yields the CPU to the training (and a recovery)
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        # the writer lowers its own priority as it begins, which a loaded machine may not have let it do yet
        lowered, deadline = min(19, mine + WRITER_NICENESS), time.monotonic() + 10.0
        while (writer := os.getpriority(os.PRIO_PROCESS, _writer_thread().native_id)) != lowered \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer == lowered
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the rank's own threads keep theirs
    release_background_saves()
    assert future.result(10) == ckpt.path_for(5)
    assert ckpt.load(5) == {"weights": [1.0, 2.0], "step": 5}
    assert ckpt.wait(0) is True


def test_save_async_keeps_one_save_in_flight(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep=2)
    hold_background_saves(HELD)
    first = ckpt.save_async({"step": 1}, 1)
    assert ckpt.wait(0.05) is False  # the first is still to be written
    second_returned = threading.Event()
    caller = threading.Thread(target=lambda: (ckpt.save_async({"step": 2}, 2), second_returned.set()))
    caller.start()
    assert not second_returned.wait(0.3)  # it waits for the first rather than holding a second copy
    assert not first.done()
    release_background_saves()
    caller.join(10)
    assert second_returned.is_set() and first.result(10) == ckpt.path_for(1)
    assert ckpt.wait(10) and ckpt.steps() == [1, 2] and ckpt.load(2) == {"step": 2}
    ckpt.save_async({"step": 3}, 3).result(10)
    assert ckpt.steps() == [2, 3]  # pruned to keep=2 as a blocking save would
    hold_background_saves(HELD)
    ckpt.save_async({"step": 4}, 4)
    with pytest.raises(TimeoutError, match="previous background save is still being written"):
        ckpt.save_async({"step": 5}, 5, timeout=0.1)  # a bounded wait for the one before
    release_background_saves()
    assert ckpt.wait(10) and ckpt.steps() == [3, 4]  # step 5 was not taken


def test_a_state_that_cannot_be_serialized_fails_at_the_call(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):
        ckpt.save_async({"bad": lambda: None}, 2)
    assert ckpt.steps() == [] and os.listdir(tmp_path) == [] and ckpt.wait(0)
    with pytest.raises(ValueError, match="non-negative integer"):
        ckpt.save_async({"ok": 4}, -1)


def test_failed_background_write_is_logged_and_held_by_its_future(tmp_path, caplog):
    directory = tmp_path / "ckpt"
    ckpt = CheckpointManager(directory)
    hold_background_saves(HELD)
    with caplog.at_level(logging.ERROR, logger="taskd.worker.checkpoint"):
        future = ckpt.save_async({"ok": 1}, 1)
        directory.rmdir()  # gone before the held write begins
        release_background_saves()
        assert ckpt.wait(10) is True  # does not raise: the error is the future's
    assert isinstance(future.exception(0), FileNotFoundError)
    assert "background checkpoint of step 1" in caplog.text and str(directory) in caplog.text
    tb = future.exception(0).__traceback__
    assert tb is not None  # kept, for where it failed, but its frames no longer hold the serialized state
    while tb is not None:
        assert not any(isinstance(v, (io.BytesIO, memoryview)) for v in tb.tb_frame.f_locals.values()), tb.tb_frame
        tb = tb.tb_next
    directory.mkdir()
    assert ckpt.save_async({"ok": 2}, 2).result(10) == ckpt.path_for(2)  # the next one works


class _EmptyWritesSerializer(JsonSerializer):
    """Writes an empty piece first, as a serializer may (a zero-length record)."""

    def dump(self, state, out) -> None:
        out.write(b"")
        super().dump(state, out)


def test_a_serializer_that_writes_nothing_at_once_is_fine(tmp_path):
    ckpt = CheckpointManager(tmp_path, serializer=_EmptyWritesSerializer())
    ckpt.save({"a": 1}, 1)  # blocking
    assert ckpt.save_async({"a": 2}, 2).result(10) == ckpt.path_for(2)
    assert ckpt.load(1) == {"a": 1} and ckpt.load(2) == {"a": 2}
