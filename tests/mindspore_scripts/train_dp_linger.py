"""examples/mindspore/train_dp.py, with one rank lingering a few seconds after training before it exits.

A MindSpore worker unregisters from msrun's scheduler while its interpreter shuts down, so the rank that
lingers unregisters last. On two hosts one node finishing a few seconds after another is ordinary; on
one machine the order is left to chance unless a test fixes it, which is what ``--linger-rank`` does.
Every other argument goes to train_dp.py unchanged; as msrun's scheduler this is train_dp.py as it is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "mindspore"))

import train_dp  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--linger-rank", type=int, default=1, help="global rank (RANK_ID) that lingers")
    p.add_argument("--linger", type=float, default=5.0, help="seconds it lingers after training")
    ours, rest = p.parse_known_args()
    code = train_dp.main(rest)
    worker = os.environ.get("MS_ROLE") == "MS_WORKER"
    if code == 0 and worker and os.environ.get("RANK_ID") == str(ours.linger_rank):
        print(f"rank {ours.linger_rank} lingers {ours.linger:.1f}s before it exits", flush=True)
        time.sleep(ours.linger)
    return code


if __name__ == "__main__":
    sys.exit(main())
