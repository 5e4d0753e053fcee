"""Live recovery of a script with a real input pipeline (issue 21, item 3), under `taskd run`.

examples/torch/train_ddp_loader.py: a GPT-style LM fed by a DataLoader over a DistributedSampler, with
dropout, AdamW, SequentialLR, gradient clipping and a logging all-reduce. A rank SIGKILLed in the middle of
an epoch is replaced live and the job ends bit-identical to a fault-free run of the same script under plain
torchrun. And the "newest common step" collective a torchrun script does before its loop is refused at once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_ddp_loader.py"
STEPS = 14  # 96 sequences over 2 ranks in batches of 8: 6 steps to an epoch, so 2 epochs and 2 steps
CRASH_STEP = 8  # epoch 1, batch 2: mid-epoch
TIMEOUT = 120.0


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_", "TORCHELASTIC_"))}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])
    clean["OMP_NUM_THREADS"] = "1"
    return clean


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env(), cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv[:4]} did not finish in {TIMEOUT:.0f}s:\n{exc.stdout}\n{exc.stderr}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """final.pt of a fault-free run of the same script under plain torchrun (a DataLoader, no worker process)."""
    tmp = tmp_path_factory.mktemp("reference")
    ref = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
               "--steps", str(STEPS), "--out", str(tmp / "ref")], tmp)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    return torch.load(tmp / "ref" / "final.pt")


# torch's DataLoader with a forked worker process per rank (resumed by skipping sampler indices), after a
# RetryableError at step 3 that every rank redoes in place with the same batch; and torchdata's
# StatefulDataLoader (resumed from the survivor's state_dict)
@pytest.mark.parametrize(("loader", "extra", "resumed_by", "actions"), [
    ("torch", ["--workers", "1", "--retry", "0:3"], "sampler", ["retry", "rejoin"]),
    ("stateful", [], "state_dict", ["rejoin"])])
def test_a_rank_killed_mid_epoch_is_replaced_live_at_its_data_position_bit_identically(
        tmp_path: Path, reference: dict, loader: str, extra: list[str], resumed_by: str, actions: list[str]) -> None:
    if loader == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    proc = run([sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nproc-per-node", "2", str(EXAMPLE),
                "--steps", str(STEPS), "--out", str(tmp_path / "out"), "--crash", f"1:{CRASH_STEP}",
                "--loader", loader, *extra], tmp_path)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    assert f"rank 1: SIGKILL at step {CRASH_STEP}" in console
    assert "replaced rank(s) [1] with recover; the group re-formed" in console, console[-4000:]
    started = dict(re.findall(r"(\d+):(\d+)", re.search(r"started 2 rank\(s\) \(rank:pid ([^)]*)\)", console)[1]))

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ranks = summary["ranks"]
    assert ranks["0"]["pid"] == int(started["0"])  # the survivor kept its process...
    assert ranks["1"]["pid"] != int(started["1"])  # ...the dead rank was replaced
    assert summary["recomputed"] == {"0": 0, "1": 0}, summary["recomputed"]  # 0 steps redone, on either rank
    assert [e["action"] for e in ranks["0"]["recoveries"]] == actions
    assert ranks["0"]["recoveries"][-1]["generation"] == ranks["1"]["generation"]
    # both ended where a fault-free run ends (epoch 2, batch 2), the replacement by skipping sampler indices
    assert ranks["0"]["position"] == ranks["1"]["position"] == [2, 2]
    assert ranks["1"]["skipped_by_loading"] == 0 and ranks["1"]["resumed_by"] == resumed_by
    assert ranks["0"]["resumed_by"] is None  # the survivor kept its iterator
    final = torch.load(tmp_path / "out" / "final.pt")
    assert final.keys() == reference.keys()
    for key in final:  # dropout, AdamW, the LR schedule and the data order all match torchrun's fault-free run
        assert torch.equal(final[key], reference[key]), f"{key} differs by {(final[key] - reference[key]).abs().max()}"


def test_a_checkpoint_written_inside_the_step_resumes_a_job_rescheduling_bit_identically(
        tmp_path: Path, reference: dict) -> None:
    """Issue 32 F4: a checkpoint written inside `with live.step():` right after optimizer.step() (where a torchrun
    script writes it) held the data position of the step before: every restart from it repeated a batch, and the
    final parameters differed from a fault-free run. Live recovery off (TASKD_RDZV_STORE=rank): rank 1's SIGKILL at
    step 8 restarts every rank from the step-5 checkpoint, mid-epoch (6 steps to an epoch)."""
    argv = [sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nproc-per-node", "2", str(EXAMPLE),
            "--steps", str(STEPS), "--out", str(tmp_path / "out"), "--crash", f"1:{CRASH_STEP}", "--ckpt-every", "5",
            "--save-in-step"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env={**env(),
                              "TASKD_RDZV_STORE": "rank"}, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"did not finish in {TIMEOUT:.0f}s:\n{exc.stdout}\n{exc.stderr}")
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    assert "strategy: job-rescheduling" in console, console[-4000:]
    assert (tmp_path / "out" / "ckpt" / "rank0").exists()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ranks"]["0"]["position"] == [2, 2]  # where a fault-free run ends
    final = torch.load(tmp_path / "out" / "final.pt")
    for key in final:  # no batch seen twice, none skipped: torchrun's fault-free run exactly
        assert torch.equal(final[key], reference[key]), f"{key} differs by {(final[key] - reference[key]).abs().max()}"


NEWEST_COMMON_STEP = """\
import torch, torch.distributed as dist
from taskd.worker.torch import LiveGroup

live = LiveGroup(backend="gloo")
model = torch.nn.Linear(4, 1)
live.track(model=model)
newest = torch.tensor([0])
dist.all_reduce(newest, op=dist.ReduceOp.MIN)  # the script's own "newest common step"
for step in live.steps(int(newest), 3):
    with live.step():
        pass
live.close()
"""


def test_a_collective_of_the_scripts_own_before_the_loop_is_refused_at_job_start(tmp_path: Path) -> None:
    """Before, the job ran; the first replacement's all_reduce met the survivors' state handover and broke it."""
    script = tmp_path / "newest_common.py"
    script.write_text(NEWEST_COMMON_STEP)
    proc = run([sys.executable, "-m", "taskd.run", "--max-restarts", "0", "--nproc-per-node", "1", str(script)],
               tmp_path)
    console = proc.stdout + proc.stderr
    assert proc.returncode != 0, console[-3000:]
    assert "LiveUsageError: rank 0: 1 collective(s) of the script's own ran between LiveGroup() and live.steps()" \
        in console, console[-3000:]
    assert "pass each rank's own newest step to live.steps(start, ...)" in console
