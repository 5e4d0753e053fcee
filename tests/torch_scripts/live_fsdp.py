"""FSDP2 (`fully_shard`) inside LiveGroup: rank 1 SIGKILLs itself once at step 3 (issue 21, D7).

argv: STEPS OUT. Sharded state has no whole copy on a peer, so the job must take job-rescheduling at once.
"""

import os
import signal
import sys

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from taskd.worker.torch import LiveGroup

steps, out = int(sys.argv[1]), sys.argv[2]
live = LiveGroup(backend="gloo", timeout=60)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
live.track(model=model, optimizer=optimizer, seed=0)
marker = os.path.join(out, "killed")
for step in live.steps(0, steps):
    with live.step():
        if live.rank == 1 and step == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(step * 10 + live.rank)
        optimizer.zero_grad()
        model(torch.randn(4, 8, generator=g)).sum().backward()
        optimizer.step()
live.close()
