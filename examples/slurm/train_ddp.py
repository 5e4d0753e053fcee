"""A plain DDP training script, as torchrun runs it: `taskd run` runs it unchanged.

It reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT through init_process_group's env://,
saves a checkpoint every --ckpt-every steps and resumes from the newest one when (re)started,
which is all taskd's recovery needs from it. gloo on CPU, nccl when CUDA is there.

    taskd run --standalone --nproc-per-node 2 examples/slurm/train_ddp.py --steps 200
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--ckpt-dir", default="ckpt")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(32, 1).to(device), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = os.path.join(args.ckpt_dir, "last.pt")
    start = 0
    if os.path.exists(path):  # a restart: resume where the job last saved
        state = torch.load(path, map_location=device)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    gen = torch.Generator().manual_seed(rank)
    for step in range(start, args.steps):
        x = torch.randn(64, 32, generator=gen).to(device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1},
                           path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
            print(f"rank {rank}: step {step + 1} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
