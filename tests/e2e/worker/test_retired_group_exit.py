"""A rank that left a gloo group with work still waiting exits at once when training ends.

Freeing such a group joins its worker threads, and they wait out the work's collective timeout: in a
3-node live job (CI, test_node_loss_live) rank 0 finished its last step and was then held 20 s at
interpreter exit and aborted by gloo ("Timed out waiting 30000ms for send operation to complete").
Without `--hold` this script takes the whole timeout (11.6 s with a 10 s one, measured: the group's last
reference goes in `destroy_process_group`, which then waits for the allreduce to time out).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SCRIPT = Path(__file__).resolve().parents[2] / "torch_scripts" / "retired_group_exit.py"
TIMEOUT = 120.0  # the allreduce's: an exit that waited for it would take two minutes


def test_a_held_group_with_waiting_work_does_not_hold_the_exit(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = [sys.executable, str(SCRIPT), "--store", str(store), "--timeout", str(TIMEOUT)]
    peer = subprocess.Popen([*args, "--rank", "1"], stdout=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        out = subprocess.run([*args, "--rank", "0", "--hold"], capture_output=True, text=True, timeout=TIMEOUT)
        took = time.monotonic() - started
    finally:
        peer.kill()
        peer.wait(timeout=10)
    assert out.returncode == 0, out.stderr
    assert "its allreduce completed: False" in out.stdout  # the work was still waiting when the group was left
    assert "kept past exit: 1" in out.stdout
    assert took < TIMEOUT / 2, f"rank 0's exit took {took:.1f}s: it waited on the left group's allreduce"
