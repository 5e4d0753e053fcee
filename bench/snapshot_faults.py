"""Steps redone per fault and host memory held, for bench/snapshots.py: a trainer SIGKILLed at a seeded step, then
restored by a new process from what survived it.

For each method and k, ``--faults`` times: a child process (forked from this one, torch already imported: no
start-up to wait for) builds bench/snapshot_model.py's model and AdamW, trains and saves every k steps, and after
``kill_at`` steps (drawn from ``random.Random(--seed)`` in [k + 1, 2k]: every phase of the save cycle alike) starts
step ``kill_at`` + 1, runs its forward pass and SIGKILLs itself: a fault in the middle of a step, the last save's
background work (taskd's checksum and publish, DCP's write) left to however far it got. This process then
builds a fresh model and optimizer, restores from what the method left, and records the step it restored: steps
redone = ``kill_at`` − that step.

- ``taskd``: `TorchSnapshots(keep=--keep).save` into a /dev/shm directory; restore: `TorchSnapshots.restore`,
  the newest published snapshot (the directory is the agent's in a job, so it outlives the rank);
- ``torch.save``: `torch.save` + fsync + rename, blocking; restore: `torch.load` of the newest file;
- ``dcp.async_save``: `dcp.async_save` into a directory per step, one write in flight; a step counts as saved when
  its write has finished (its future's callback writes a marker), and a save removes the complete ones older than
  the newest; restore: `dcp.load` of the newest marked step.

Host memory: a child per method that saves at k = 1 for ``keep`` + 2 steps, waits for its last save's background
work, and reads its ``RssAnon`` and ``RssShmem`` (/proc/self/status; against a child that trains as long without
saving) and the bytes its method holds outside the process: taskd's segments in /dev/shm (``keep`` published + 1
being written, each the state rounded up to 64 KiB; these pages are the ``RssShmem`` the trainer maps, not more
memory), measured at each of ``--keeps``; the files on disk for the others.

    PYTHONPATH=. python bench/snapshot_faults.py --ks 1,5,10,20 --faults 3 [--hidden 1024 --layers 8]

Prints one line ``RESULT <json>`` (bench/snapshots.py runs it as a subprocess, away from its gRPC server: a fork
is safe here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from snapshot_model import build, train_step  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

from taskd.worker.torch_snapshot import TorchSnapshots  # noqa: E402

METHODS = ("taskd", "torch.save", "dcp.async_save")
CHILD_TIMEOUT = 900.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ks", default="1,5,10,20")
    p.add_argument("--faults", type=int, default=3, help="kills per method and k")
    p.add_argument("--keep", type=int, default=2, help="taskd's snapshots kept (Snapshots' keep)")
    p.add_argument("--keeps", default="2,4", help="the keeps whose host memory is measured (LiveGroup's is 4)")
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--disk", default=None, help="parent of the on-disk directories (default: the temp dir)")
    args = p.parse_args(argv)
    args.ks = tuple(int(k) for k in args.ks.split(","))
    args.keeps = tuple(int(k) for k in args.keeps.split(",") if k)
    if min(args.ks) < 1 or args.faults < 1 or min((args.keep, *args.keeps)) < 2:
        p.error("every k >= 1, --faults >= 1, --keep >= 2")
    return args


def status() -> dict[str, int]:
    """This process's RssAnon and RssShmem in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssShmem"):
                out[name] = int(value.split()[0]) * 1024
    return out


def held(directory: str) -> int:
    """Bytes allocated under ``directory`` (st_blocks: what tmpfs or the disk holds)."""
    return sum(os.stat(os.path.join(root, f)).st_blocks * 512 for root, _, files in os.walk(directory) for f in files)


class Saver:
    """One method's saves in the child, and the parent's restore from what they left."""

    def __init__(self, method: str | None, k: int, keep: int, shm: str, disk: str) -> None:
        self.method, self.k, self.keep, self.shm, self.disk = method, k, keep, shm, disk
        self.pending: Any = None

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, snaps: Any, step: int) -> None:
        if self.method == "taskd":
            snaps.save(step)
        elif self.method == "torch.save":
            tmp = os.path.join(self.disk, "state.pt.tmp")
            with open(tmp, "wb") as fh:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(self.disk, "state.pt"))
        elif self.method == "dcp.async_save":
            if self.pending is not None:
                self.pending.result(timeout=300)  # one write in flight
            newest = max(self.done(), default=0)  # all a restore needs (no write in flight now): the older go
            for name in os.listdir(self.disk):
                if name.startswith("step-") and int(name[5:]) < newest:
                    shutil.rmtree(os.path.join(self.disk, name), ignore_errors=True)
            model_sd, optim_sd = get_state_dict(model, optimizer)
            self.pending = dcp.async_save({"model": model_sd, "optimizer": optim_sd},
                                          checkpoint_id=os.path.join(self.disk, f"step-{step}"), no_dist=True)
            marker = os.path.join(self.disk, f"done-{step}")
            self.pending.add_done_callback(lambda f: f.exception() is None and open(marker, "w").close())

    def done(self) -> list[int]:
        """The steps whose DCP write finished."""
        return [int(n.removeprefix("done-")) for n in os.listdir(self.disk) if n.startswith("done-")]

    def outside(self) -> int:
        """Bytes the method holds outside the process: /dev/shm for taskd, the disk for the others."""
        return held(self.shm) if self.method == "taskd" else held(self.disk)

    def restore(self, args: argparse.Namespace) -> int:
        model, optimizer = build(args)
        if self.method == "taskd":
            return TorchSnapshots(model, optimizer, keep=self.keep, directory=self.shm).restore()
        if self.method == "torch.save":
            path = os.path.join(self.disk, "state.pt")
            if not os.path.exists(path):
                return 0
            saved = torch.load(path, weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            return int(saved["step"])
        done = self.done()
        if not done:
            return 0
        model_sd, optim_sd = get_state_dict(model, optimizer)
        loaded = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(loaded, checkpoint_id=os.path.join(self.disk, f"step-{max(done)}"), no_dist=True)
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
        return max(done)


def child(args: argparse.Namespace, saver: Saver, steps: int, report: str, kill: bool) -> None:
    """Train ``steps`` steps saving every k, write the memory facts; then, with ``kill``, start the next step and
    die in it."""
    model, optimizer = build(args)
    snaps = TorchSnapshots(model, optimizer, keep=saver.keep, directory=saver.shm) if saver.method == "taskd" \
        else None
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1))
    for step in range(1, steps + 1):
        train_step(model, optimizer, x)
        if saver.method is not None and step % saver.k == 0:
            saver.save(model, optimizer, snaps, step)
    if not kill:  # the last save's background work done: what a trainer holds between its saves
        if saver.pending is not None:
            saver.pending.result(timeout=300)
        if snaps is not None:
            snaps.snapshots.wait()
    with open(report, "w") as fh:
        json.dump({**status(), "outside": saver.outside()}, fh)
    if kill:
        model(x).square().mean()  # the forward pass of step ``steps`` + 1: the fault lands in the middle of a step
        os.kill(os.getpid(), signal.SIGKILL)


def forked(args: argparse.Namespace, method: str | None, k: int, steps: int, kill: bool, keep: int
           ) -> dict[str, Any]:
    """A child trainer's run (see `child`), then, after a kill, the restore; its facts."""
    shm = tempfile.mkdtemp(prefix="taskd-bench-fault-", dir="/dev/shm")
    disk = tempfile.mkdtemp(prefix="taskd-bench-fault-", dir=args.disk)
    saver = Saver(method, k, keep, shm, disk)
    report = os.path.join(disk, "facts.json")
    try:
        pid = os.fork()
        if pid == 0:  # the trainer: never returns
            try:
                child(args, saver, steps, report, kill)
                os._exit(0)
            finally:
                os._exit(1)
        _, code = os.waitpid(pid, 0)
        if kill and not (os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL) or \
                not kill and os.waitstatus_to_exitcode(code) != 0:
            raise RuntimeError(f"the trainer of {method} k={k} ended with status {code}")
        with open(report) as fh:
            facts = json.load(fh)
        if not kill:
            return facts
        restored = saver.restore(args) if method is not None else 0
        return {"kill_at": steps, "restored": restored, "redone": steps - restored}
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    os.environ.pop("TASKD_SNAPSHOT_DIR", None)
    rng = random.Random(args.seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for k in args.ks:
        for _ in range(args.faults):
            kill_at = rng.randint(k + 1, 2 * k)
            for method in METHODS:
                name = f"{method} k={k}"
                out.setdefault(name, []).append(forked(args, method, k, kill_at, True, args.keep))
                print(f"fault: {name}: killed in step {kill_at + 1}, restored {out[name][-1]['restored']}",
                      file=sys.stderr, flush=True)
    memory: dict[str, dict[str, Any]] = {}
    for method, keep in [(None, 2), *((m, args.keep) for m in METHODS), *(("taskd", k) for k in args.keeps)]:
        name = "none" if method is None else f"{method} keep={keep}" if method == "taskd" else method
        if name not in memory:  # k = 1, keep + 2 saves: every segment a rank holds is there
            memory[name] = forked(args, method, 1, keep + 2, False, keep)
            print(f"memory: {name}: {memory[name]}", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"keep": args.keep, "faults": out, "memory": memory}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
