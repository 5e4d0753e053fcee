"""Data-parallel MindSpore training on CPU that survives being killed and restarted.

Run it with msrun (see docs/mindspore.md). Every rank computes the gradient of its shard of a
deterministic global batch, the gradients are all-reduced (``nn.DistributedGradReducer``), so all
ranks hold identical weights. Every ``--ckpt-every`` steps each rank saves network and optimizer
state with ``mindspore.save_checkpoint`` (atomically: temp file, fsync, rename) into its own
directory; at start it resumes from the newest step that every rank has. The data of a step depends
only on the step number, so a run interrupted and resumed ends with the same weights, bit for bit,
as an uninterrupted one.

``--snapshot-every K`` also keeps network and optimizer in the node's memory every K steps
(`taskd.worker.mindspore.SnapshotCallback`, held by taskd's msrun plugin outside the ranks): a rescheduled job
then restores the newest step every rank holds from memory and redoes at most K steps, not the steps since the
last checkpoint; the disk checkpoints are the fallback.

msrun runs this script a third time as the scheduler (``MS_ROLE=MS_SCHED``); there
``mindspore.communication.init()`` runs the scheduler itself and the script ends after it.

``--timeline DIR`` appends each incarnation's milestones (wall-clock, JSON lines) to
``DIR/<rank>.jsonl`` (``DIR/sched.jsonl`` for the scheduler): process created, main() entered,
``mindspore`` imported, communication initialised, checkpoint loaded, every step done.
bench/msrun_recovery.py reads them to say where a recovery's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

try:  # taskd's worker SDK, when installed: about a microsecond a call, and a no-op outside taskd
    from taskd.worker import heartbeat, on_save_request, save_on_error
except ImportError:  # the example also runs under a plain msrun
    import contextlib

    def heartbeat(step: int | None = None) -> None:
        pass

    def on_save_request(callback) -> None:
        pass

    save_on_error = contextlib.nullcontext


CKPT_RE = re.compile(r"^step(\d+)\.ckpt$")
KEEP_CHECKPOINTS = 3  # ranks are at most one save apart, so the common step is always kept
IN_DIM, HIDDEN, OUT_DIM = 16, 32, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="total optimisation steps")
    p.add_argument("--batch", type=int, default=32, help="global batch size (split over ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=10, help="save a checkpoint every K steps")
    p.add_argument("--ckpt-dir", required=True, help="checkpoints go to <ckpt-dir>/rank_<r>/")
    p.add_argument("--out", required=True, help="final weights go to <out>/rank_<r>.npy")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to slow it down)")
    p.add_argument("--sleep-while", default="", metavar="FILE",
                   help="sleep --step-sleep per step only while FILE exists (a test paces the job while it acts on it)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--snapshot-every", type=int, default=0, help="in-memory snapshot every K steps (0: none)")
    p.add_argument("--crash-once-at-step", type=int, default=-1, help="rank 1 exits with code 13 at this step, once")
    p.add_argument("--crash-rank", type=int, default=1, help="which rank --crash-once-at-step crashes")
    p.add_argument("--marker", default="", help="file that records the crash (default <ckpt-dir>/crashed_once)")
    p.add_argument("--timeline", default="", help="append this incarnation's milestones to <dir>/<rank>.jsonl")
    return p.parse_args(argv)


def process_created() -> float | None:
    """When this process was created, wall clock, from /proc (to ~10 ms): before the interpreter started."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Timeline:
    """This incarnation's milestones, one JSON line each, appended (a restarted rank adds to the same file)."""

    def __init__(self, directory: str) -> None:
        self.path = ""
        if directory:
            os.makedirs(directory, exist_ok=True)
            who = "sched" if os.environ.get("MS_ROLE") == "MS_SCHED" else os.environ.get("RANK_ID", "0")
            self.path = os.path.join(directory, f"{who}.jsonl")
            self.mark("created", process_created())
            self.mark("script")  # main() entered: the interpreter, numpy and taskd.worker are loaded

    def mark(self, what: str, t: float | None = None, **detail: object) -> None:
        if not self.path:
            return
        line = json.dumps({"what": what, "t": time.time() if t is None else t, "pid": os.getpid(), **detail})
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def global_batch(step: int, seed: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch of one step: a function of (seed, step) only, so a resumed run sees the same data."""
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((batch, IN_DIM)).astype(np.float32)
    w_true = np.random.default_rng([seed, 10**6]).standard_normal((IN_DIM, OUT_DIM)).astype(np.float32)
    y = np.tanh(x @ w_true).astype(np.float32)
    return x, y


def list_checkpoints(rank_dir: str) -> list[int]:
    if not os.path.isdir(rank_dir):
        return []
    steps = [int(m.group(1)) for m in (CKPT_RE.match(n) for n in os.listdir(rank_dir)) if m]
    return sorted(steps)


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomically(ms, train_cell, rank_dir: str, step: int) -> None:
    """Temp file, fsync, rename, fsync dir: a crash leaves either the old or the new checkpoint."""
    os.makedirs(rank_dir, exist_ok=True)
    tmp = os.path.join(rank_dir, f".tmp-step{step}-{os.getpid()}.ckpt")
    ms.save_checkpoint(train_cell, tmp, append_dict={"step": step})
    fsync_path(tmp)
    os.replace(tmp, os.path.join(rank_dir, f"step{step}.ckpt"))
    fsync_path(rank_dir)
    for old in list_checkpoints(rank_dir)[:-KEEP_CHECKPOINTS]:
        os.remove(os.path.join(rank_dir, f"step{old}.ckpt"))


def save_npy_atomically(path: str, array: np.ndarray) -> None:
    tmp = f"{path}.tmp-{os.getpid()}.npy"
    np.save(tmp, array)
    fsync_path(tmp)
    os.replace(tmp, path)


def run_scheduler() -> int:
    """msrun's scheduler role: init() serves the cluster's metadata until the workers are done."""
    from mindspore.communication import init

    init()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    timeline = Timeline(args.timeline)
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return run_scheduler()

    import mindspore as ms
    from mindspore import nn, ops
    from mindspore.communication import get_group_size, get_rank, init

    timeline.mark("imported")
    ms.set_device("CPU")
    ms.set_seed(args.seed)
    init()
    timeline.mark("init")
    rank, size = get_rank(), get_group_size()
    if args.batch % size:
        print(f"--batch {args.batch} is not divisible by the {size} ranks", file=sys.stderr, flush=True)
        return 2
    shard = args.batch // size
    print(f"rank {rank}/{size} pid {os.getpid()} started", flush=True)

    net = nn.SequentialCell(nn.Dense(IN_DIM, HIDDEN), nn.Tanh(), nn.Dense(HIDDEN, OUT_DIM))
    # Identical initial weights on every rank, independent of MindSpore's global RNG state.
    init_rng = np.random.default_rng([args.seed, 7])
    for _, param in sorted(net.parameters_and_names()):
        param.set_data(ms.Tensor((0.3 * init_rng.standard_normal(param.shape)).astype(np.float32)))
    loss_fn = nn.MSELoss()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=args.lr, momentum=0.9)
    grad_reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=size)
    forward = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)
    state = nn.CellList([net, optimizer])  # what a checkpoint holds: weights and momentum

    rank_dir = os.path.join(args.ckpt_dir, f"rank_{rank}")
    snapshots = None
    start = 0
    if args.snapshot_every > 0:
        from taskd.worker.mindspore import SnapshotCallback

        snapshots = SnapshotCallback(net, optimizer, every=args.snapshot_every)
        start = snapshots.restore()  # the newest step every rank holds in memory, loaded; 0: none
        restored = np.zeros(size, dtype=np.float32)
        restored[rank] = start
        steps = ops.AllReduce()(ms.Tensor(restored)).asnumpy()
        if steps.min() != steps.max():
            raise SystemExit(f"rank {rank}: restored step {start} from memory, the ranks {steps.tolist()}: not one cut")
        if start:
            print(f"rank {rank} resumed from step {start} ({snapshots.restored_from})", flush=True)
    mine = list_checkpoints(rank_dir)
    # The newest step every rank has. CPU AllReduce only sums float32: each rank fills its own slot.
    latest = np.zeros(size, dtype=np.float32)
    latest[rank] = mine[-1] if mine else 0
    common = int(ops.AllReduce()(ms.Tensor(latest)).asnumpy().min()) if start == 0 else 0
    if common > 0:
        params = ms.load_checkpoint(os.path.join(rank_dir, f"step{common}.ckpt"))
        start = int(params.pop("step").asnumpy())
        not_loaded, _ = ms.load_param_into_net(state, params, strict_load=True)
        if not_loaded:
            raise RuntimeError(f"checkpoint step{common} lacks {not_loaded}")
        print(f"rank {rank} resumed from step {start}", flush=True)
    timeline.mark("loaded", step=start)

    # The dump strategy's save request: served at a heartbeat, or, when a peer died and this rank's
    # AllReduce failed, by save_on_error() below; either way with the last completed step's state.
    done = start
    on_save_request(lambda: save_atomically(ms, state, rank_dir, done))
    marker = args.marker or os.path.join(args.ckpt_dir, "crashed_once")
    for step in range(start, args.steps):
        if step == args.crash_once_at_step and rank == args.crash_rank and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(f"rank {rank} crashed at step {step}\n")
            print(f"rank {rank} crashing at step {step} as asked", flush=True)
            os._exit(13)
        x, y = global_batch(step, args.seed, args.batch)
        xs, ys = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
        with save_on_error():  # a failed collective leaves the weights of step `done`: saved if a dump asks
            loss, grads = forward(ms.Tensor(xs), ms.Tensor(ys))
            optimizer(grad_reducer(grads))
        done = step + 1
        timeline.mark("step", step=done)
        heartbeat(done)  # lets taskd tell a hung rank from a slow one (TASKD_HEARTBEAT_TIMEOUT)
        print(f"rank {rank} step {done} loss {float(loss.asnumpy()):.6f}", flush=True)
        if done % args.ckpt_every == 0 or done == args.steps:
            save_atomically(ms, state, rank_dir, done)
        if snapshots is not None and done % args.snapshot_every == 0:
            snapshots.save(done)  # a copy of weights and momentum into the node's memory, published in background
        if args.step_sleep > 0 and (not args.sleep_while or os.path.exists(args.sleep_while)):
            time.sleep(args.step_sleep)

    if snapshots is not None:
        snapshots.snapshots.close()
    os.makedirs(args.out, exist_ok=True)
    flat = np.concatenate([p.asnumpy().ravel() for _, p in sorted(net.parameters_and_names())])
    save_npy_atomically(os.path.join(args.out, f"rank_{rank}.npy"), flat)
    print(f"rank {rank} finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
