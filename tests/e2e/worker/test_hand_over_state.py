"""A replacement's state arrives whole: the optimizer's and ``extra`` tensors travel apart, flat per dtype."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from taskd.worker.torch_state import BUCKET_BYTES, buckets, join_tensors, split_tensors  # noqa: E402

pytestmark = pytest.mark.torch

SCRIPT = Path(__file__).resolve().parents[2] / "torch_scripts" / "hand_over_state.py"


@pytest.mark.parametrize("numpy", ["with numpy", "without numpy"])
def test_two_real_ranks_hand_over_adam_and_mixed_extra_state_exactly(tmp_path: Path, numpy: str) -> None:
    # torch does not need numpy, so a job may lack it: a replacement's hand-over once died there ("Numpy is not
    # available", bench/peers.py's venv); a numpy that fails to import stands for it missing
    env = dict(os.environ)
    if numpy == "without numpy":
        (tmp_path / "hide" / "numpy").mkdir(parents=True)
        (tmp_path / "hide" / "numpy" / "__init__.py").write_text(
            "raise ModuleNotFoundError('numpy is not installed', name='numpy')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hide"), env.get("PYTHONPATH", "")])
    args = [sys.executable, str(SCRIPT)]
    store = str(tmp_path / "store")
    source = subprocess.Popen([*args, "0", store], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    receiver = subprocess.run([*args, "1", store], capture_output=True, text=True, timeout=120, env=env)
    out, err = source.communicate(timeout=60)
    assert source.returncode == 0, err
    assert receiver.returncode == 0, receiver.stderr
    assert "identical: True; shared tensor still shared: True; adam steps: [3.0, 3.0, 3.0, 3.0]" in receiver.stdout


def test_split_then_join_gives_back_the_structure_with_the_same_tensors() -> None:
    shared = torch.arange(4)
    grad = torch.ones(2, requires_grad=True)  # not plain data: pickled with the skeleton
    state = {"a": [shared, (1, "x", shared)], "b": {"z": torch.zeros(0)}, "g": grad, "n": None}
    tensors: list = []
    skeleton = split_tensors(state, tensors)
    assert len(tensors) == 2  # shared once, the empty one; not the one needing grad
    assert skeleton["g"] is grad and skeleton["n"] is None
    back = join_tensors(skeleton, tensors)
    assert back["a"][0] is shared and back["a"][1][2] is shared and back["a"][1][:2] == (1, "x")
    assert back["b"]["z"] is tensors[1]


def test_large_tensors_travel_alone_and_small_ones_of_a_dtype_together() -> None:
    big = BUCKET_BYTES // 4  # float32 elements of one full bucket
    tensors = [torch.zeros(10), torch.zeros(big), torch.zeros(5, dtype=torch.int64), torch.zeros(0),
               torch.zeros(big - 5), torch.zeros(20), torch.zeros(3, dtype=torch.int64)]
    # 10 + (big - 5) small floats fill a bucket; the empty one takes no message
    assert buckets(tensors) == [[1], [0, 4], [2, 6], [5]]
