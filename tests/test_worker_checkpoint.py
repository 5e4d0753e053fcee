"""CheckpointManager: atomic saves, pruning, and never returning a damaged checkpoint."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from taskd.worker import CheckpointManager, CorruptCheckpoint
from taskd.worker.checkpoint import HEADER_SIZE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 30.0


def test_save_load_roundtrip_with_numpy(tmp_path):
    ckpt = CheckpointManager(tmp_path, keep=3)
    assert ckpt.load_latest() is None and ckpt.latest_step() is None
    state = {"w": np.arange(10, dtype=np.float64), "rng": np.random.default_rng(1).bit_generator.state, "step": 7}
    path = ckpt.save(state, 7)
    assert os.path.basename(path) == "ckpt-000000000007.tkc"
    loaded, step = ckpt.load_latest()
    assert step == 7 and loaded["step"] == 7 and loaded["rng"] == state["rng"]
    np.testing.assert_array_equal(loaded["w"], state["w"])
    assert ckpt.latest_step() == 7
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


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


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".ckpt-5.{int(dead.stdout)}.abcd1234.tmp"
    stale.write_bytes(b"partial")
    live = tmp_path / f".ckpt-5.{os.getppid()}.abcd1234.tmp"  # a writer that is still alive
    live.write_bytes(b"partial")
    CheckpointManager(tmp_path)
    assert not stale.exists() and live.exists()


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


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_serializer_needs_torch(tmp_path):
    with pytest.raises(ValueError, match="torch"):
        CheckpointManager(tmp_path, serializer="torch")


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


SAVE_LOOP = textwrap.dedent(
    """
    import sys
    import numpy as np
    from taskd.worker import CheckpointManager
    ckpt = CheckpointManager(sys.argv[1], keep=2)
    start = ckpt.latest_step() or 0
    print(start, flush=True)
    for step in range(start + 1, 100000):
        ckpt.save({"step": step, "w": np.full(1_000_000, step, dtype=np.float64)}, step)
    """
)


def test_sigkill_during_save_never_leaves_a_corrupt_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    last = 0
    for attempt in range(6):
        saver = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert int(saver.stdout.readline()) == last  # it resumed from the newest intact checkpoint
            time.sleep(0.05 + 0.07 * attempt)  # land somewhere inside a save of 8 MB
        finally:
            saver.send_signal(signal.SIGKILL)
            saver.wait(TIMEOUT)
            saver.stdout.close()
        found = CheckpointManager(tmp_path, keep=2).load_latest()
        if found is None:
            continue
        state, step = found
        assert state["step"] == step >= last
        assert state["w"].shape == (1_000_000,) and (state["w"] == step).all()
        last = step
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".corrupt")]
    assert last > 0
