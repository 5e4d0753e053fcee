"""A deterministic training loop that survives being killed: snapshots, checkpoints, resume, heartbeats.

Each rank fits a linear model to its own synthetic data with plain SGD (numpy
only). The batch of step ``s`` is a pure function of (seed, rank, s), so a rank
that resumes from a checkpoint recomputes exactly the same updates: the final
parameters are bit-identical to an uninterrupted run.

Under ``taskd run`` each rank also snapshots its state in memory after every step
(``worker.Snapshots``, held in /dev/shm by the node's agent): a restarted rank
resumes from the step it had reached and redoes none. Outside taskd, or when no
snapshot survives, it resumes from its newest disk checkpoint.

    python examples/train_resumable.py --steps 200 --ckpt-every 20 --ckpt-dir /tmp/ckpt --out /tmp/out
    taskd run --nproc-per-node 4 examples/train_resumable.py --steps 200 --ckpt-every 20 \\
        --ckpt-dir /tmp/ckpt --out /tmp/out --step-sleep 0.02 --crash-once-at-step 50

Outputs per rank: ``OUT/rank<R>.npy`` (final parameters) and ``OUT/rank<R>.json``
(steps computed in total including recomputed ones, the step it resumed from).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

try:
    from taskd import worker
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from taskd import worker


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True, help="total number of SGD steps")
    p.add_argument("--ckpt-every", type=int, required=True, help="checkpoint every K steps")
    p.add_argument("--ckpt-dir", required=True, help="checkpoint directory (one subdirectory per rank)")
    p.add_argument("--out", required=True, help="directory for the final parameters and run summary")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--sleep-while", default=None, metavar="FILE",
                   help="sleep --step-sleep per step only while FILE exists (a test paces the job while it acts on it)")
    p.add_argument("--crash-once-at-step", type=int, default=None,
                   help="rank 1 crashes once after computing this step (a marker file in --out remembers it)")
    p.add_argument("--ckpt-timeout", type=float, default=60.0, help="section timeout of a checkpoint save")
    p.add_argument("--keep", type=int, default=3, help="checkpoints kept per rank")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if args.steps < 0 or args.ckpt_every < 1:
        p.error("--steps must be >= 0 and --ckpt-every >= 1")
    return args


def true_weights(seed: int, rank: int, dim: int) -> np.ndarray:
    return np.random.default_rng([seed, rank, 0]).standard_normal(dim)


def batch(seed: int, rank: int, step: int, dim: int, size: int, w_true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The data of one step: depends on (seed, rank, step) only, never on earlier steps."""
    rng = np.random.default_rng([seed, rank, 1, step])
    x = rng.standard_normal((size, dim))
    y = x @ w_true + 0.01 * rng.standard_normal(size)
    return x, y


def write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = worker.rank()
    os.makedirs(args.out, exist_ok=True)
    ckpt = worker.CheckpointManager(os.path.join(args.ckpt_dir, f"rank{rank}"), keep=args.keep)

    # scope "rank": the ranks never exchange state, so each restores its own newest snapshot (no common step)
    snapshots = worker.Snapshots(scope="rank", fallback=ckpt)
    found = snapshots.restore()  # memory first, else the newest disk checkpoint, else None
    state = found[0] if found else {"w": np.zeros(args.dim), "step": 0}
    resumed_from = state["step"]

    # one byte per computed step, appended unbuffered: survives a crash, counts recomputed steps too
    counter_path = os.path.join(args.out, f"rank{rank}.computed")
    fresh = found is None and worker.restart_count() == 0 and not os.path.exists(crash_marker(args.out))
    counter = os.open(counter_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0), 0o644)

    def save_now() -> None:
        with worker.section("checkpoint", timeout=args.ckpt_timeout):
            ckpt.save(state, state["step"])

    worker.on_save_request(save_now)
    # the ranks never talk to each other: a restarted rank needs nothing from the others, so the agent
    # may restart just the dead one (recover) instead of the whole job
    worker.declare_rejoinable()
    source = f", from {snapshots.restored_from}" if snapshots.restored_from else ""
    print(f"rank {rank}: starting at step {resumed_from}/{args.steps} (restart {worker.restart_count()}{source})",
          flush=True)

    w_true = true_weights(args.seed, rank, args.dim)
    for step in range(resumed_from, args.steps):
        x, y = batch(args.seed, rank, step, args.dim, args.batch, w_true)
        residual = x @ state["w"] - y
        state = {"w": state["w"] - args.lr * (x.T @ residual) / args.batch, "step": step + 1}
        snapshots.save(state, state["step"])  # one memory copy; the disk checkpoints below are for after the job
        os.write(counter, b".")
        worker.heartbeat(state["step"])

        if rank == 1 and args.crash_once_at_step == state["step"] and not os.path.exists(crash_marker(args.out)):
            write_atomically(crash_marker(args.out), str(state["step"]).encode())
            print(f"rank {rank}: crashing at step {state['step']} as asked", file=sys.stderr, flush=True)
            os._exit(1)

        if state["step"] % args.ckpt_every == 0:
            save_now()
            loss = float(np.mean(residual**2))
            print(f"rank {rank}: step {state['step']}/{args.steps} loss {loss:.6f}", flush=True)
        if args.step_sleep > 0 and (args.sleep_while is None or os.path.exists(args.sleep_while)):
            time.sleep(args.step_sleep)

    os.close(counter)
    computed = os.path.getsize(counter_path)
    np.save(os.path.join(args.out, f"rank{rank}.tmp.npy"), state["w"])
    os.replace(os.path.join(args.out, f"rank{rank}.tmp.npy"), os.path.join(args.out, f"rank{rank}.npy"))
    summary = {"rank": rank, "steps": args.steps, "computed": computed, "resumed_from": resumed_from,
               "restart_count": worker.restart_count(), "restored_from": snapshots.restored_from}
    write_atomically(os.path.join(args.out, f"rank{rank}.json"), json.dumps(summary).encode())
    print(f"rank {rank}: done, {computed} steps computed, resumed from step {resumed_from}", flush=True)
    return 0


def crash_marker(out: str) -> str:
    return os.path.join(out, "crashed_once.rank1")


if __name__ == "__main__":
    sys.exit(main())
