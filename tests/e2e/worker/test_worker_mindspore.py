"""`taskd.worker.mindspore.TaskdCallback` in a real `Model.train` (one process, MindSpore on CPU).

The rank runs in a subprocess with its heartbeat file, as under taskd: heartbeats per step, the
ModelCheckpoint it drives, sections seen by a callback placed inside the save, and a save request
(what the `dump` strategy sends) served at the next step end into the ModelCheckpoint's directory, and
one served when a step raises (as when a dead peer's AllReduce fails), with the last completed step's state.
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

from taskd.worker import HeartbeatFile

if importlib.util.find_spec("mindspore") is None:
    pytest.skip("MindSpore is not installed (pip install -e '.[mindspore]')", allow_module_level=True)

pytestmark = pytest.mark.mindspore
ROOT = Path(__file__).resolve().parents[3]

RANK = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint
    from taskd.worker import HeartbeatFile
    from taskd.worker.mindspore import TaskdCallback

    out, hb_path = sys.argv[1], os.environ["TASKD_HEARTBEAT_FILE"]
    ms.set_device("CPU")
    x = np.arange(32, dtype=np.float32).reshape(16, 2) / 32
    data = ds.NumpySlicesDataset({"x": x, "y": x.copy()}, shuffle=False).batch(4)  # 4 steps an epoch
    net = nn.Dense(2, 2)
    hb = HeartbeatFile(hb_path)
    seen = {"sections": []}

    class Probe(ModelCheckpoint):
        """The ModelCheckpoint, noting the heartbeat file's section while it saves."""
        def step_end(self, run_context):
            seen["sections"].append(hb.read().section)
            super().step_end(run_context)

    class Ask(Callback):  # the agent's side of a dump: ask for a save after step 5
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 5:
                seen["request"] = hb.request_save()

    ckpt = Probe(prefix="net", directory=os.path.join(out, "ckpt"), config=CheckpointConfig(save_checkpoint_steps=4))
    cb = TaskdCallback(ckpt)
    Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)).train(
        2, data, callbacks=[cb, Ask()], dataset_sink_mode=False)
    state = hb.read()
    seen.update(step=state.step, beats=state.beats, ack=state.save_ack, ok=state.save_ok, dumped=cb.dumped,
                files=sorted(os.listdir(os.path.join(out, "ckpt"))),
                dump_keys=sorted(ms.load_checkpoint(cb.dumped[-1])) if cb.dumped else [])

    class Fail(Callback):  # a dump asked for while step 3 fails where no heartbeat comes (a dead peer's AllReduce)
        def on_train_step_begin(self, run_context):
            if run_context.original_args().cur_step_num == 3:
                seen["request2"] = hb.request_save()
                seen["weight_at_2"] = net.weight.asnumpy().tolist()
                raise RuntimeError("Launch kernel failed: Default/AllReduce-op0")

    cb2 = TaskdCallback(ModelCheckpoint(prefix="net2", directory=os.path.join(out, "ckpt2")))
    try:
        Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)).train(
            1, ds.NumpySlicesDataset({"x": x, "y": x.copy()}, shuffle=False).batch(4),
            callbacks=[cb2, Fail()], dataset_sink_mode=False)
    except RuntimeError as exc:
        seen["raised"] = str(exc)
    state = hb.read()
    saved = ms.load_checkpoint(cb2.dumped[-1]) if cb2.dumped else {}
    weight = [k for k in saved if k.endswith("weight") and "moment" not in k]
    seen.update(ack2=state.save_ack, ok2=state.save_ok, dumped2=cb2.dumped,
                dump2_step=int(saved["step"].asnumpy()) if "step" in saved else None,
                dump2_weight=saved[weight[0]].asnumpy().tolist() if len(weight) == 1 else sorted(saved))

    class Ask3(Callback):  # a resumed launch (initial_epoch=1): cur_step_num restarts at 0, the global step does not
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 2:
                seen["request3"] = hb.request_save()

    cb3 = TaskdCallback(ModelCheckpoint(prefix="net3", directory=os.path.join(out, "ckpt3")))
    Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)).train(
        3, ds.NumpySlicesDataset({"x": x, "y": x.copy()}, shuffle=False).batch(4), callbacks=[cb3, Ask3()],
        dataset_sink_mode=False, initial_epoch=1)
    state = hb.read()
    stamp = ms.load_checkpoint(cb3.dumped[-1]) if cb3.dumped else {}
    seen.update(step3=state.step, dumped3=cb3.dumped,
                stamp3={k: int(stamp[k].asnumpy()) for k in ("step", "epoch_num", "step_num") if k in stamp})
    print(json.dumps(seen))
''')


def test_taskd_callback_beats_drives_the_checkpoint_in_sections_and_serves_a_save_request(tmp_path: Path) -> None:
    hb_path = HeartbeatFile(tmp_path / "rank_0.hb").create().path
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKD_", "MS_", "RANK_"))}
    env.update(TASKD_HEARTBEAT_FILE=str(hb_path), GLOG_v="3", TASKD_STRATEGIES="dump,exit",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", RANK, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["step"] == 8 and seen["beats"] >= 8  # a heartbeat per step of 2 epochs x 4 steps
    assert seen["sections"] and set(seen["sections"]) == {"checkpoint"}  # every save ran inside the section
    assert any(f.startswith("net") and f.endswith(".ckpt") for f in seen["files"]), seen["files"]
    assert seen["ack"] == seen["request"] == 1 and seen["ok"], seen  # served at step 6's end, successfully
    (dumped,) = seen["dumped"]
    assert os.path.basename(dumped) == "taskd-dump-net-step6.ckpt" and os.path.dirname(dumped).endswith("ckpt")
    assert "step" in seen["dump_keys"] and any(k.endswith("weight") for k in seen["dump_keys"]), seen["dump_keys"]
    # with dump offered, one line at the start says what MindSpore cannot do (docs/mindspore.md)
    assert out.stderr.count("MindSpore cannot save while a collective blocks the training thread") == 1, (
        out.stderr[-2000:])  # once per process, though Model.train ran twice
    # a step that raises (a collective failed): the pending request is served on the training thread, with the
    # state of the last step completed (2), and the step's error still reaches the script
    assert seen["raised"] == "Launch kernel failed: Default/AllReduce-op0", seen
    assert seen["ack2"] == seen["request2"] == 2 and seen["ok2"], seen
    assert [os.path.basename(p) for p in seen["dumped2"]] == ["taskd-dump-net2-step2.ckpt"], seen["dumped2"]
    assert seen["dump2_step"] == 2 and seen["dump2_weight"] == seen["weight_at_2"], seen
    # issue 37: a launch resumed at epoch 1 of 4-step epochs beats global steps 5..12; a dump served at its third
    # step is named and stamped with global step 7, in epoch 2, as ModelCheckpoint's append_info would
    assert seen["step3"] == 12, seen
    assert [os.path.basename(p) for p in seen["dumped3"]] == ["taskd-dump-net3-step7.ckpt"], seen["dumped3"]
    assert seen["stamp3"] == {"step": 7, "epoch_num": 2, "step_num": 7}, seen
