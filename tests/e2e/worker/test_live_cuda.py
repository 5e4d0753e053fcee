"""What a GPU job gets from `LiveGroup` (issue 34, item 5), on a machine with one CUDA device.

One GPU holds at most one rank of an NCCL group, so this checks what one GPU can: a CUDA model over a gloo
group (two ranks on one device) replaced live, its state staged through the host for gloo's send and recv;
a warm spare that built its CUDA model (and so holds a CUDA context) before the fault; and an NCCL group,
which taskd cannot rebuild: one console line says so and a fault restarts every rank from its checkpoint.
Skipped without CUDA (CI has none); docs/pytorch.md "GPUs and NCCL" states the results.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support.run import run_to_end  # noqa: E402

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "torch" / "train_ddp.py"
SMALL = ["--hidden", "64", "--layers", "2", "--steps", "30", "--ckpt-every", "10", "--step-sleep", "0.05",
         "--pg-timeout", "30", "--device", "cuda"]


def taskd_run(tmp: Path, nproc: int, extra: list[str] = (), flags: list[str] = ()) -> tuple[int, str, dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINDX_", "TASKD_"))}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "taskd.run", "--monitor-interval", "0.2", "--nproc-per-node", str(nproc),
            *flags, str(EXAMPLE), *SMALL, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(tmp / "out"), *extra]
    code, console = run_to_end(argv, tmp / "console.log", 240.0, env=env, cwd=ROOT)
    assert code == 0, console[-6000:]
    return code, console, json.loads((tmp / "out" / "summary.json").read_text())


def final(tmp: Path) -> dict:
    return torch.load(tmp / "out" / "final.pt")


def assert_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in got:
        assert torch.equal(got[key], want[key]), f"{key} differs by {(got[key] - want[key]).abs().max()}"


def start_pids(console: str) -> dict[int, int]:
    found = re.search(r"started \d+ rank\(s\) \(rank:pid ([0-9:, ]+)\)", console)
    assert found, console[-3000:]
    return {int(r): int(p) for r, p in (item.split(":") for item in found.group(1).split(", "))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("reference")
    taskd_run(tmp, 2)
    return final(tmp)


@pytest.mark.parametrize("spare", [False, True], ids=["fresh", "warm-spare"])
def test_a_cuda_model_over_gloo_loses_a_rank_and_is_recovered_live(tmp_path, reference, spare):
    flags = ["--warm-spares", "1", "--warm-spare-mode", "script"] if spare else []
    # the spare starts after the ranks and imports torch and builds its CUDA model before the fault: 0.5 s steps
    fault = ["--crash", "1:25", "--step-sleep", "0.5"] if spare else ["--crash", "1:12"]
    _, console, info = taskd_run(tmp_path, 2, fault, flags)
    assert "strategy: recover for rank(s) [1]" in console and "job-rescheduling" not in console, console[-6000:]
    assert info["ranks"]["0"]["pid"] == start_pids(console)[0]  # the survivor kept its process (and its CUDA state)
    assert info["recomputed"] == {"0": 0, "1": 0}
    assert_identical(final(tmp_path), reference)
    if spare:  # the spare built its CUDA model before the fault: it held a CUDA context, waiting
        noticed = info["ranks"]["0"]["recoveries"][0]["time"]
        assert info["ranks"]["1"]["script_started"] < noticed - 1.0


def test_an_nccl_group_says_it_is_not_live_and_a_fault_restarts_every_rank(tmp_path_factory):
    ref = tmp_path_factory.mktemp("nccl-reference")
    taskd_run(ref, 1, ["--backend", "nccl"])
    tmp = tmp_path_factory.mktemp("nccl-fault")
    _, console, info = taskd_run(tmp, 1, ["--backend", "nccl", "--crash", "0:12"])
    assert "live recovery is off for this job: backend 'nccl'" in console, console[-6000:]
    assert "job-rescheduling" in console
    assert info["restart_count"] == 1 and info["recomputed"] == {"0": 2}  # from the step-10 checkpoint
    assert_identical(final(tmp), final(ref))
