"""The tests of tests/e2e/worker/test_checkpoint.py that start no process and open no network socket
(the unit tier).

Split from it by move_tests.py; its subject: CheckpointManager: atomic saves, pruning, and never
returning a damaged checkpoint.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from taskd.worker import CheckpointManager, CorruptCheckpoint
from taskd.worker.checkpoint import HEADER_SIZE


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
