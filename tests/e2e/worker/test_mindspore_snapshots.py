"""`taskd.worker.mindspore.SnapshotCallback` in a real `Model.train` (one process, MindSpore on CPU).

A rank trains 2 epochs of 4 steps with a snapshot every 3 global steps into a snapshot directory (as the msrun
plugin gives one); a second process, a fresh network and optimizer, restores: the newest step (6), and every
parameter, the optimizer's moments included, equal to the trainer's at that step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("mindspore") is None:
    pytest.skip("MindSpore is not installed (pip install -e '.[mindspore]')", allow_module_level=True)

pytestmark = pytest.mark.mindspore
ROOT = Path(__file__).resolve().parents[3]

RANK = textwrap.dedent('''
    import json, sys
    import numpy as np
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model
    from taskd.worker.mindspore import SnapshotCallback

    mode, out = sys.argv[1], sys.argv[2]
    ms.set_device("CPU")
    ms.set_seed(1)
    net = nn.Dense(2, 2)
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    snaps = SnapshotCallback(net, opt, every=3)

    def params():
        return {p.name: p.asnumpy().tolist() for cell in (net, opt) for _, p in cell.parameters_and_names()}

    if mode == "train":
        seen = {}

        class Keep(Callback):
            def on_train_step_end(self, run_context):
                seen[run_context.original_args().cur_step_num] = params()

        x = np.arange(32, dtype=np.float32).reshape(16, 2) / 32
        data = ds.NumpySlicesDataset({"x": x, "y": x.copy()}, shuffle=False).batch(4)  # 4 steps an epoch
        Model(net, nn.MSELoss(), opt).train(2, data, callbacks=[snaps, Keep()], dataset_sink_mode=False)
        json.dump(seen[6], open(out, "w"))
    else:
        step = snaps.restore()
        json.dump({"step": step, "from": snaps.restored_from, "params": params()}, open(out, "w"))
''')


def run(mode: str, out: Path, snap_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_", "MS_", "RANK"))}
    env.update(PYTHONPATH=str(ROOT), TASKD_SNAPSHOT_DIR=str(snap_dir), GLOG_v="3")
    proc = subprocess.run([sys.executable, "-c", RANK, mode, str(out)], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_snapshot_callback_saves_every_k_global_steps_and_a_new_process_restores_them(tmp_path: Path) -> None:
    snap_dir = tmp_path / "snap"
    snap_dir.mkdir()
    run("train", tmp_path / "at6.json", snap_dir)
    assert sorted(os.listdir(snap_dir / "rank0")) == ["s000000000003.snap", "s000000000006.snap"]
    run("restore", tmp_path / "restored.json", snap_dir)
    restored = json.loads((tmp_path / "restored.json").read_text())
    at6 = json.loads((tmp_path / "at6.json").read_text())
    assert restored["step"] == 6 and restored["from"] == "memory", restored
    assert any(name.startswith("moments") for name in at6), sorted(at6)
    assert restored["params"] == at6
