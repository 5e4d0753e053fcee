"""Data-parallel `Model.train` on CPU with `ModelCheckpoint` and taskd's `TaskdCallback`; survives a kill.

The high-level counterpart of train_dp.py's hand-written loop: a `GeneratorDataset` sharded over the
ranks, `Model(net, loss, optimizer)` in DATA_PARALLEL mode (MindSpore all-reduces the gradients),
a `ModelCheckpoint` every epoch handed to `TaskdCallback`, which beats once per step (so hang
detection works without a loop body to call `heartbeat()` in), runs the saves inside sections and
serves the `dump` strategy's save request. At start every rank resumes from the newest epoch all
ranks have a checkpoint of (`load_checkpoint`, `initial_epoch`). The data of a sample depends only on
its index, so a run killed and resumed ends with the weights of an uninterrupted one.

    MS_ENABLE_TFT='{RSC:1}' msrun --worker_num 2 --local_worker_num 2 --master_port 8118 --log_dir logs \\
        examples/mindspore/train_model.py --ckpt-dir ckpt --out out

msrun runs the script a third time as its scheduler (`MS_ROLE=MS_SCHED`): there `init()` is the
scheduler and the script ends after it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

IN_DIM, HIDDEN, OUT_DIM = 16, 32, 4
PREFIX = "net"
# ModelCheckpoint names files <prefix>-<epoch>_<step>.ckpt and, when a file of that prefix exists already
# (a resumed run), switches to <prefix>_<n>: both are ours.
CKPT_RE = re.compile(rf"^{PREFIX}(?:_\d+)?-(\d+)_(\d+)\.ckpt$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--steps-per-epoch", type=int, default=8, help="global batches per epoch")
    p.add_argument("--batch", type=int, default=16, help="global batch size (split over ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", required=True, help="ModelCheckpoint writes <ckpt-dir>/rank_<r>/")
    p.add_argument("--out", required=True, help="final weights go to <out>/rank_<r>.npy")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to make a run long enough")
    p.add_argument("--hang-once-at-step", type=int, default=-1,
                   help="rank --fault-rank stops making progress at this global step, once")
    p.add_argument("--fault-rank", type=int, default=1)
    return p.parse_args(argv)


def sample(index: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal(IN_DIM).astype(np.float32)
    w_true = np.random.default_rng([seed, 10**6]).standard_normal((IN_DIM, OUT_DIM)).astype(np.float32)
    return x, np.tanh(x @ w_true).astype(np.float32)


class Samples:
    """A random-access source: GeneratorDataset shards it by index over the ranks."""

    def __init__(self, count: int, seed: int) -> None:
        self.count, self.seed = count, seed

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return sample(int(index), self.seed)

    def __len__(self) -> int:
        return self.count


def checkpoints(rank_dir: str) -> dict[int, str]:
    """epoch -> file of ModelCheckpoint's epoch-end saves in this rank's directory."""
    found: dict[int, str] = {}
    for name in os.listdir(rank_dir) if os.path.isdir(rank_dir) else ():
        m = CKPT_RE.match(name)
        if m:
            found[int(m.group(1))] = os.path.join(rank_dir, name)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mindspore.communication import init

    if os.environ.get("MS_ROLE") == "MS_SCHED":
        init()
        return 0
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn, ops
    from mindspore.communication import get_group_size, get_rank
    from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

    try:
        from taskd.worker.mindspore import TaskdCallback
    except ImportError:  # plain msrun without taskd: train all the same
        TaskdCallback = None  # noqa: N806

    ms.set_device("CPU")
    ms.set_seed(args.seed)
    init()
    rank, size = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    if args.batch % size:
        print(f"--batch {args.batch} is not divisible by the {size} ranks", file=sys.stderr, flush=True)
        return 2
    print(f"rank {rank}/{size} pid {os.getpid()} started", flush=True)

    net = nn.SequentialCell(nn.Dense(IN_DIM, HIDDEN), nn.Tanh(), nn.Dense(HIDDEN, OUT_DIM))
    init_rng = np.random.default_rng([args.seed, 7])
    for _, param in sorted(net.parameters_and_names()):
        param.set_data(ms.Tensor((0.3 * init_rng.standard_normal(param.shape)).astype(np.float32)))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=args.lr, momentum=0.9)

    rank_dir = os.path.join(args.ckpt_dir, f"rank_{rank}")
    mine = checkpoints(rank_dir)
    latest = np.zeros(size, dtype=np.float32)  # the newest epoch every rank has (CPU AllReduce sums float32)
    latest[rank] = max(mine) if mine else 0
    start_epoch = int(ops.AllReduce()(ms.Tensor(latest)).asnumpy().min())
    if start_epoch > 0:
        params = ms.load_checkpoint(mine[start_epoch])
        for cell in (net, optimizer):
            ms.load_param_into_net(cell, params)
        print(f"rank {rank} resumed from epoch {start_epoch} ({os.path.basename(mine[start_epoch])})", flush=True)

    data = ds.GeneratorDataset(Samples(args.batch * args.steps_per_epoch, args.seed), ["x", "y"], shuffle=False,
                               num_shards=size, shard_id=rank).batch(args.batch // size)
    model = Model(net, nn.MSELoss(), optimizer)
    ckpt = ModelCheckpoint(prefix=PREFIX, directory=rank_dir,
                           config=CheckpointConfig(save_checkpoint_steps=args.steps_per_epoch, keep_checkpoint_max=3))
    marker = os.path.join(args.ckpt_dir, "hung_once")

    class Pace(Callback):
        """The example's knobs: a sleep per step, and one hang of one rank (the script's own code, not a
        collective: that is what taskd's hang detection must tell apart)."""

        def on_train_step_end(self, run_context):  # noqa: ANN001, ANN202
            step = run_context.original_args().cur_step_num
            if step == args.hang_once_at_step and rank == args.fault_rank and not os.path.exists(marker):
                with open(marker, "w") as fh:
                    fh.write(str(os.getpid()))
                print(f"rank {rank} stops making progress at step {step}", flush=True)
                time.sleep(3600)
            if args.step_sleep:
                time.sleep(args.step_sleep)

    callbacks = [TaskdCallback(ckpt) if TaskdCallback is not None else ckpt, Pace()]
    model.train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False, initial_epoch=start_epoch)

    os.makedirs(args.out, exist_ok=True)
    weights = np.concatenate([p.asnumpy().ravel() for _, p in sorted(net.parameters_and_names())])
    np.save(os.path.join(args.out, f"rank_{rank}.npy"), weights)
    print(f"rank {rank} done: epochs {start_epoch}..{args.epochs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
