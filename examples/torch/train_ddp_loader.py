"""A small GPT-style LM fed by a DataLoader over a DistributedSampler, recovered live by taskd.

What a real DDP script brings to live recovery: a DataLoader with a DistributedSampler (shuffled,
epoch after epoch), dropout, AdamW, a warm-up + cosine SequentialLR, gradient clipping and a
logging all-reduce after the optimizer step. `live.data(loader)` keeps the data position: a
redone step gets its batch again, and a replacement resumes at the survivors' (epoch, batch) for
its own rank, skipping sampler indices rather than loading batches. With `track(seed=...)` the
dropout masks of a step are a function of (seed, rank, step), so a run with faults ends
bit-identical to one without.

    torchrun --standalone --nproc-per-node 2 examples/torch/train_ddp_loader.py --steps 40 --out /tmp/lm/out
    taskd run --nproc-per-node 3 examples/torch/train_ddp_loader.py --steps 40 --out /tmp/lm/out --crash 1:13 \\
        --retry 2:5

Rank 0 writes OUT/final.pt (the model's state_dict) and OUT/summary.json (steps computed per rank,
pids, the data position each rank ended at, recoveries).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

try:
    from taskd.worker.torch import LiveGroup
except ImportError:  # run from a source checkout without installing taskd
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from taskd.worker.torch import LiveGroup
from taskd import worker
from taskd.worker.live import RetryableError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps (epochs follow from the data)")
    p.add_argument("--out", required=True, help="directory for final.pt, summary.json and checkpoints")
    p.add_argument("--ckpt-every", type=int, default=0, help="per-rank checkpoint every K steps (0: never)")
    p.add_argument("--save-in-step", action="store_true",
                   help="write the checkpoint inside `with live.step():`, right after the optimizer step (where a "
                        "torchrun script writes it), instead of after the block")
    p.add_argument("--samples", type=int, default=96, help="sequences in the data set")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--loader", choices=("torch", "stateful"), default="torch",
                   help="torch's DataLoader, or torchdata's StatefulDataLoader (pip install torchdata)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--pg-timeout", type=float, default=30.0, help="collective timeout in seconds")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (to watch it run)")
    p.add_argument("--crash", action="append", default=[], metavar="RANK:STEP",
                   help="rank RANK SIGKILLs itself in the middle of step STEP, once per job (repeatable)")
    p.add_argument("--retry", action="append", default=[], metavar="RANK:STEP",
                   help="rank RANK raises RetryableError in step STEP, once per job: every rank redoes the step")
    args = p.parse_args(argv)
    try:
        args.crashes = {tuple(int(v) for v in spec.split(":", 1)) for spec in args.crash}
        args.retries = {tuple(int(v) for v in spec.split(":", 1)) for spec in args.retry}
    except ValueError:
        p.error(f"--crash and --retry take RANK:STEP, got {args.crash + args.retry}")
    return args


class Tokens(Dataset):
    """Sequence i: tokens of a fixed random bigram chain, seeded by i (any rank can load any sample)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.chain = torch.randint(args.vocab, (args.vocab, 4), generator=torch.Generator().manual_seed(args.seed))

    def __len__(self) -> int:
        return self.args.samples

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.args.seed * 7919 + i)
        tokens = [int(torch.randint(self.args.vocab, (1,), generator=g))]
        for choice in torch.randint(4, (self.args.seq,), generator=g).tolist():
            tokens.append(int(self.chain[tokens[-1], choice]))
        return torch.tensor(tokens)


class TinyLM(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.width)
        self.pos = nn.Parameter(torch.zeros(args.seq, args.width))
        self.block = nn.TransformerEncoderLayer(args.width, nhead=2, dim_feedforward=2 * args.width, dropout=0.1,
                                                batch_first=True)
        self.head = nn.Linear(args.width, args.vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(args.seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.block(h, src_mask=self.causal, is_causal=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    live = LiveGroup(backend="gloo", timeout=args.pg_timeout)  # instead of dist.init_process_group("gloo")
    rank = live.rank
    dataset = Tokens(args)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as DataLoaderClass
    else:
        DataLoaderClass = DataLoader  # noqa: N806
    loader = DataLoaderClass(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    torch.manual_seed(args.seed)  # every rank builds the same initial weights
    model = TinyLM(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.steps - warmup))], [warmup])
    ddp = live.ddp(model)                      # instead of DistributedDataParallel(model)
    data = live.data(loader)                   # instead of `sampler.set_epoch(epoch); for batch in loader`
    live.track(model=model, optimizer=optimizer, seed=args.seed, scheduler=scheduler)

    ckpt = worker.CheckpointManager(os.path.join(args.out, "ckpt", f"rank{rank}"), keep=2, serializer="torch")

    def load(step: int) -> None:  # no rank holds live state: job start, or every rank restarted
        if step:
            state = ckpt.load(step)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            data.load_state_dict(state["data"])

    computed = os.open(os.path.join(args.out, f"rank{rank}.computed"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loss_sum = torch.zeros(1)
    # this rank's newest checkpoint: live.steps() agrees on the lowest across ranks (no collective of our own here)
    for step in live.steps(ckpt.latest_step() or 0, args.steps, load=load):
        with live.step():
            tokens = next(data)
            optimizer.zero_grad(set_to_none=True)
            logits = ddp(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            if (rank, step) in args.crashes and once(args, "crash", rank, step):
                os.kill(os.getpid(), signal.SIGKILL)
            if (rank, step) in args.retries and once(args, "retry", rank, step):
                raise RetryableError(f"injected at step {step}")  # the step is redone, with the same batch
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()                   # commits the step
            scheduler.step()
            os.write(computed, b".")
            mean = loss.detach().reshape(1) / live.world_size
            dist.all_reduce(mean)              # the logging all-reduce, after the commit
            loss_sum += mean
            if args.save_in_step and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                # after optimizer.step() the step is committed: data.state_dict() is its position too
                ckpt.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                           "scheduler": scheduler.state_dict(), "data": data.state_dict()}, step + 1)
        if not args.save_in_step and args.ckpt_every and live.step_no % args.ckpt_every == 0 \
                and live.step_no > step:
            ckpt.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "scheduler": scheduler.state_dict(), "data": data.state_dict()}, live.step_no)
        if rank == 0 and live.step_no % 10 == 0:
            print(f"step {live.step_no}/{args.steps} epoch {data.epoch} loss {mean.item():.4f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    os.close(computed)
    record = {"rank": rank, "pid": os.getpid(), "generation": live.protocol.generation, "recoveries": live.events,
              "position": list(data.position), "skipped_by_loading": data.skipped_by_loading,
              "resumed_by": data.resumed_by}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    dist.barrier()
    if rank == 0:
        write_summary(args, model, live.world_size)
    live.close()
    return 0


def once(args: argparse.Namespace, kind: str, rank: int, step: int) -> bool:
    """A fault fires once per job: its marker file stays in --out."""
    try:
        os.close(os.open(os.path.join(args.out, f"{kind}{rank}-{step}.done"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    print(f"rank {rank}: {'SIGKILL' if kind == 'crash' else 'RetryableError'} at step {step}", flush=True)
    return True


def write_summary(args: argparse.Namespace, model: nn.Module, world: int) -> None:
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    ranks = {}
    for r in range(world):
        with open(os.path.join(args.out, f"rank{r}.json")) as fh:
            ranks[r] = json.load(fh)
        ranks[r]["computed"] = os.path.getsize(os.path.join(args.out, f"rank{r}.computed"))
    summary = {"steps": args.steps, "recomputed": {r: info["computed"] - args.steps for r, info in ranks.items()},
               "ranks": ranks}
    with open(os.path.join(args.out, "summary.json.tmp"), "w") as fh:
        json.dump(summary, fh, indent=1)
    os.replace(os.path.join(args.out, "summary.json.tmp"), os.path.join(args.out, "summary.json"))


if __name__ == "__main__":
    sys.exit(main())
