"""CheckpointManager: atomic saves, pruning, and never returning a damaged checkpoint."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from taskd.worker import CheckpointManager

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".ckpt-5.{int(dead.stdout)}.abcd1234.tmp"
    stale.write_bytes(b"partial")
    live = tmp_path / f".ckpt-5.{os.getppid()}.abcd1234.tmp"  # a writer that is still alive
    live.write_bytes(b"partial")
    CheckpointManager(tmp_path)
    assert not stale.exists() and live.exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_serializer_needs_torch(tmp_path):
    with pytest.raises(ValueError, match="torch"):
        CheckpointManager(tmp_path, serializer="torch")


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


SAVE_ASYNC_AND_EXIT = textwrap.dedent(
    """
    import sys
    from taskd.worker import CheckpointManager
    from taskd.worker.checkpoint import hold_background_saves

    hold_background_saves(0.5)  # the write starts well after the interpreter has reached its end
    CheckpointManager(sys.argv[1]).save_async({"step": 3, "w": list(range(1000))}, 3)
    print("returned", flush=True)
    """
)


def test_the_interpreter_waits_for_a_background_save_at_exit(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SAVE_ASYNC_AND_EXIT, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and done.stdout == "returned\n", done.stderr
    assert CheckpointManager(tmp_path).load_latest() == ({"step": 3, "w": list(range(1000))}, 3)


SAVE_ASYNC_STALLED_AT_EXIT = textwrap.dedent(
    """
    import sys
    from taskd.worker import CheckpointManager, checkpoint

    checkpoint.EXIT_WAIT = 0.5
    checkpoint.hold_background_saves(60)  # as a stalled disk would: the write does not end
    CheckpointManager(sys.argv[1]).save_async({"step": 3}, 3)
    """
)


def test_the_exit_waits_for_a_stalled_background_save_only_so_long(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SAVE_ASYNC_STALLED_AT_EXIT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and time.monotonic() - started < TIMEOUT, done.stderr
    assert "1 background checkpoint(s) still being written after 0.5 s at exit" in done.stderr
    assert "the previous checkpoint stays the newest" in done.stderr
    assert CheckpointManager(tmp_path).steps() == [] and os.listdir(tmp_path) == []


SAVE_ASYNC_PAST_A_FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    from taskd.worker import CheckpointManager

    ckpt = CheckpointManager(sys.argv[1])
    ckpt.save({"w": np.zeros(10)}, 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    future = ckpt.save_async({"w": np.zeros(1 << 20)}, 2)  # 8 MB
    error = future.exception(30)
    print(type(error).__name__, getattr(error, "errno", None), flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(ckpt.save_async({"w": np.ones(10)}, 3).result(30), flush=True)
    """
)


def test_a_background_save_that_fills_the_disk_fails_in_its_future_and_leaves_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SAVE_ASYNC_PAST_A_FULL_DISK, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    error_line, saved = done.stdout.splitlines()
    assert error_line == f"OSError {errno.EFBIG}"
    assert "background checkpoint of step 2" in done.stderr and "File too large" in done.stderr
    ckpt = CheckpointManager(tmp_path)
    assert saved == ckpt.path_for(3) and ckpt.steps() == [1, 3]
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # the failed write's temporary is gone


SAVE_ASYNC_IN_A_FORKED_CHILD = textwrap.dedent(
    """
    import os, sys
    from taskd.worker import CheckpointManager

    ckpt = CheckpointManager(sys.argv[1])
    ckpt.save_async({"by": "parent"}, 1).result(30)
    pid = os.fork()
    if pid == 0:  # the child inherits the manager but not its writer thread
        ckpt.directory = sys.argv[2]
        os.makedirs(ckpt.directory)
        path = ckpt.save_async({"by": "child"}, 2).result(30)
        os._exit(0 if ckpt.wait(30) and os.path.exists(path) else 1)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
    """
)


def test_save_async_in_a_forked_child_starts_a_writer_of_its_own(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SAVE_ASYNC_IN_A_FORKED_CHILD, str(tmp_path / "a"),
                           str(tmp_path / "b")], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and done.stdout == "0\n", done.stderr
    assert CheckpointManager(tmp_path / "b").load_latest() == ({"by": "child"}, 2)
