"""A LiveGroup job whose rank 1 raises an exception of its own (not a collective's) once, at step 5.

argv: STEPS OUT EXC, with EXC one of TimeoutError, ConnectionResetError, ValueError, exit3 (sys.exit(3)) or exit0
(sys.exit(0): the rank leaves its group early, its peers train on); or
inside-model: four errors of the script's own raised inside the model, each once (`INSIDE`: a TimeoutError and a
ConnectionResetError in the module's forward, called through DDP, and in a backward hook, issue 32 F1); or
abort-after-end: rank 1 aborts (once) after live.close(), once rank 0 has finished (torch's gloo teardown abort,
issue 21 D3, issue 32 F2); or abort-at-exit: rank 1 is SIGKILLed at step 6 and its replacement aborts after
live.close(), and so does rank 2 (issue 32 F2).
Each rank writes OUT/rank<R>.pids (its pid at every start) and rank 0 OUT/final.pt.
"""

import os
import signal
import sys
import time

import torch
from torch import nn

from taskd.worker.torch import LiveGroup

steps, out, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
live = LiveGroup(backend="gloo", timeout=60)
with open(os.path.join(out, f"rank{live.rank}.pids"), "a") as fh:
    fh.write(f"{os.getpid()}\n")
INSIDE = {4: (1, "forward", TimeoutError), 8: (2, "forward", ConnectionResetError),
          12: (1, "hook", TimeoutError), 16: (0, "hook", ConnectionResetError)}  # step: (rank, where, error)


def raise_once(step: int, where: str) -> None:
    """The script's own error (a remote feature read, say), raised in `where` once: its replacement goes on."""
    rank_, at, exc = INSIDE.get(step, (None, None, None))
    flag = os.path.join(out, f"raised-{step}")
    if kind == "inside-model" and rank_ == live.rank and at == where and not os.path.exists(flag):
        open(flag, "w").close()
        raise exc(f"the script's own error in {where} at step {step} (a remote read, say)")


class Model(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # called through DDP's forward
        raise_once(step, "forward")
        return super().forward(x)


torch.manual_seed(0)
model = Model(8, 1)
model.weight.register_hook(lambda grad: raise_once(step, "hook"))  # runs inside DDP's backward
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ddp = live.ddp(model)
live.track(model=model, optimizer=optimizer, seed=0)
marker = os.path.join(out, "raised")
KINDS = ("TimeoutError", "ConnectionResetError", "ValueError", "exit3", "exit0")
for step in live.steps(0, steps):
    with live.step():
        g = torch.Generator().manual_seed(step * 10 + live.rank)
        x = torch.randn(4, 8, generator=g)
        if live.rank == 1 and step == 5 and kind in KINDS and not os.path.exists(marker):
            open(marker, "w").close()
            if kind in ("exit3", "exit0"):
                sys.exit(int(kind[-1]))  # SystemExit is no Exception: it leaves live.step() untouched
            raise {"TimeoutError": TimeoutError, "ConnectionResetError": ConnectionResetError,
                   "ValueError": ValueError}[kind]("the script's own error (a remote read, say)")
        if kind == "abort-at-exit" and live.rank == 1 and step == 6 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        ddp(x).sum().backward()
        optimizer.step()
if live.rank == 0:
    torch.save(model.state_dict(), os.path.join(out, "final.pt"))
live.close()
if kind == "abort-at-exit":
    if live.rank == 0:
        os._exit(0)
    os.abort()  # the replacement of rank 1, and rank 2: what torch's gloo teardown does now and then
if kind != "abort-after-end":
    # what docs/pytorch.md ("Ending a DDP script") advises: torch 2.13's gloo can abort the interpreter's
    # finalization (SIGABRT, "terminate called without an active exception"; a replacement rank did, once, in a
    # full run), a fault after the last step that this test of a mid-training error is not about
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
if kind == "abort-after-end":
    done = os.path.join(out, "rank0.done")
    if live.rank == 0:
        open(done, "w").close()
    elif not os.path.exists(marker):
        open(marker, "w").close()
        for _ in range(600):  # rank 0 has exited (its agent saw it finish) before this rank dies
            if os.path.exists(done):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        os.abort()
