"""DLRover's Flash Checkpoint on bench/snapshots.py's model: its rows of that table, run in a venv of its own.

DLRover 0.6.1 needs torch 2.7, so this script runs under that venv's python (never in taskd's), imports no taskd,
and prints one line ``RESULT <json>`` that bench/snapshots.py reads. It trains the same MLP with the same steps and
saves every k steps with `DdpCheckpointer.save_checkpoint`:

- ``memory``: ``StorageType.MEMORY``: the state copied into DLRover's shared memory (the call blocks for the copy);
- ``storage``: ``StorageType.DISK``: the same copy, then an event that makes the saver write that memory to a
  file in the background (torch.save); a run ends when its last save is on disk (the saver's tracker file).

Without `dlrover-run` (as here: one process, no DLRover master), the engine starts its saver itself: a child process
(``start_saver_process``) that holds the shared memory and persists it, and that dies with the trainer (under
`dlrover-run` the node's agent holds it and a restarted trainer restores from it). A save that finds the saver
still writing the previous step to disk skips the memory copy (DLRover's rule): those are counted, not hidden.
Storage saves run at ``--storage-ks`` only: the saver waits up to 15 s before it gives up persisting a step that
a newer save overwrote in memory, which at k = 1 happens to most saves. The CPU
time per step counts the trainer's and the saver process's. Restore: ``load_checkpoint`` (from the shared memory, in
the same process) + ``load_state_dict`` into a fresh model and optimizer; from disk, ``torch.load`` of the file the
saver wrote, its pages dropped first and kept. Host memory: the bytes of its shared memory and its saver's RSS.

    python3 -m venv /work/venv-dlrover
    /work/venv-dlrover/bin/pip install "dlrover[torch]==0.6.1" "torch==2.7.*" grpcio protobuf  # its imports
    /work/venv-dlrover/bin/python bench/dlrover_peer.py --hidden 1024 --layers 8 --steps 40 --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psutil  # noqa: E402
import torch  # noqa: E402
from snapshot_model import build, drop_cache, first_step, train_step  # noqa: E402

PERSIST_TIMEOUT = 120.0
# What DLRover's saver leaves behind when it runs without its agent (fixed names: one DLRover job per node)
LEFTOVERS = ("/dev/shm/ckpt_shm_0", "/tmp/ckpt_sock")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warm-saves", type=int, default=0, help="untimed steps, each with a save, before each run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--restores", type=int, default=5)
    p.add_argument("--ks", default="1,5,10,20", help="save intervals of the memory saves")
    p.add_argument("--storage-ks", default="20", help="save intervals of the storage saves (each save that the "
                   "saver finds overwritten before it persisted it costs the saver a 15 s wait: see the docs)")
    p.add_argument("--disk", default=None, help="parent of the checkpoint directory (default: the temp dir)")
    return p.parse_args(argv)


class Flash:
    """One DdpCheckpointer for the whole run (each one starts a saver process), its steps numbered across runs."""

    def __init__(self, directory: str) -> None:
        from dlrover.python.common.storage import KeepLatestStepStrategy
        from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

        self.directory, self.types = directory, StorageType
        self.ckpt = DdpCheckpointer(directory, deletion_strategy=KeepLatestStepStrategy(1, directory))
        proc = self.ckpt._engine.saver_proc  # the saver process the engine started (None under dlrover-run)
        self.saver = psutil.Process(proc.pid) if proc is not None else None
        self.steps = itertools.count(1)

    def close(self) -> None:
        """Stop the saver process (a daemon: it would be terminated at exit anyway, before the cleanup)."""
        proc = self.ckpt._engine.saver_proc
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)

    def cpu(self) -> float:
        own = time.process_time()
        if self.saver is None:
            return own
        t = self.saver.cpu_times()
        return own + t.user + t.system

    def save(self, state: dict[str, Any], disk: bool) -> tuple[int, bool]:
        """Save ``state`` as the next step; (step, whether DLRover took it rather than skipping it)."""
        step = next(self.steps)
        kind = self.types.DISK if disk else self.types.MEMORY
        self.ckpt.save_checkpoint(step, state, os.path.join(self.directory, str(step), "rank_0.pt"), kind)
        return step, self.ckpt._engine._cached_step == step

    def persisted(self) -> int:
        try:
            with open(os.path.join(self.directory, "dlrover_latest.txt")) as fh:
                return int(fh.read().strip() or -1)
        except (FileNotFoundError, ValueError):
            return -1

    def wait_persisted(self, step: int) -> None:
        deadline = time.monotonic() + PERSIST_TIMEOUT
        while self.persisted() < step:
            if time.monotonic() > deadline:
                raise TimeoutError(f"DLRover's saver did not persist step {step} within {PERSIST_TIMEOUT:.0f} s")
            time.sleep(0.005)


def state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def train(args: argparse.Namespace, flash: Flash, method: str | None, k: int) -> dict[str, Any]:
    model, optimizer = build(args)
    x = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1))
    saves: list[float] = []
    skipped, last = 0, -1
    for _ in range(args.warm_saves):  # untimed, as bench/snapshots.py's --warm-saves
        train_step(model, optimizer, x)
        if method is not None:
            saved, took = flash.save(state(model, optimizer), disk=method == "storage")
            if method == "storage" and took:
                flash.wait_persisted(saved)
    started, cpu_started = time.perf_counter(), flash.cpu()
    for step in range(1, args.steps + 1):
        train_step(model, optimizer, x)
        if method is not None and step % k == 0:
            t0 = time.perf_counter()
            saved, took = flash.save(state(model, optimizer), disk=method == "storage")
            saves.append(time.perf_counter() - t0)
            skipped += not took
            last = saved if took else last
    if method == "storage" and last > 0:
        flash.wait_persisted(last)  # the last save on disk: counted in the run's time, as torch.save's fsync is
    elapsed, cpu = time.perf_counter() - started, flash.cpu() - cpu_started
    return {"steps_per_s": args.steps / elapsed, "cpu_per_step": cpu / args.steps, "saves": saves,
            "skipped": skipped}


def restores(args: argparse.Namespace, flash: Flash) -> dict[str, list[float]]:
    model, optimizer = build(args)
    first_step(model, optimizer, args.hidden)
    step, took = flash.save(state(model, optimizer), disk=True)
    if not took:
        raise RuntimeError("DLRover skipped the restore's save")
    flash.wait_persisted(step)
    path = os.path.join(flash.directory, str(step), "rank_0.pt")
    out: dict[str, list[float]] = {"memory": [], "disk (cache dropped)": [], "disk (page cache)": []}
    for _ in range(args.restores):
        fresh_model, fresh_opt = build(args)
        t0 = time.perf_counter()
        got = flash.ckpt.load_checkpoint()
        fresh_model.load_state_dict(got["model"])
        fresh_opt.load_state_dict(got["optimizer"])
        out["memory"].append(time.perf_counter() - t0)
        for name, drop in (("disk (cache dropped)", True), ("disk (page cache)", False)):
            if drop:
                drop_cache(path)
            fresh_model, fresh_opt = build(args)
            t0 = time.perf_counter()
            got = torch.load(path, weights_only=False)  # the saver's own file: DLRover's config object is in it
            got = got.get("model_states", got)
            fresh_model.load_state_dict(got["model"])
            fresh_opt.load_state_dict(got["optimizer"])
            out[name].append(time.perf_counter() - t0)
        if not torch.equal(fresh_model[0].weight, model[0].weight):
            raise RuntimeError("DLRover's restore did not bring the saved weights back")
    return out


def memory_held(args: argparse.Namespace, flash: Flash) -> dict[str, int]:
    """After a memory save: the bytes of DLRover's shared memory (/dev/shm) and its saver process's RssAnon and
    RssShmem (the agent's side: under dlrover-run the agent holds that memory)."""
    model, optimizer = build(args)
    first_step(model, optimizer, args.hidden)
    flash.save(state(model, optimizer), disk=False)
    facts = {"RssAnon": 0, "RssShmem": 0}
    if flash.saver is not None:
        with open(f"/proc/{flash.saver.pid}/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in facts:
                    facts[name] = int(value.split()[0]) * 1024
    shm = os.stat(LEFTOVERS[0]).st_blocks * 512 if os.path.exists(LEFTOVERS[0]) else 0
    return {"shm_bytes": shm, "saver_anon": facts["RssAnon"], "saver_shmem": facts["RssShmem"]}


def cleanup() -> None:
    """Remove what DLRover's saver leaves once it is stopped: its shared memory and sockets are never unlinked."""
    for path in LEFTOVERS:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import dlrover

    ks = [int(k) for k in args.ks.split(",")]
    storage_ks = [int(k) for k in args.storage_ks.split(",") if k]
    there = [p for p in LEFTOVERS if os.path.exists(p)]
    if there:
        print(f"{', '.join(there)} exist: another DLRover job (or a killed run) holds this node's fixed names; "
              "remove them when none runs", file=sys.stderr)
        return 2
    directory = tempfile.mkdtemp(prefix="taskd-bench-dlrover-", dir=args.disk)
    result: dict[str, Any] = {"torch": torch.__version__, "dlrover": getattr(dlrover, "__version__", "0.6.1"),
                              "runs": {}}
    flash: Flash | None = None
    try:
        flash = Flash(directory)
        result["saver_process"] = flash.saver is not None
        configs: list[tuple[str | None, int]] = [(None, 0)] + [("memory", k) for k in ks]
        configs += [("storage", k) for k in storage_ks]
        for r in range(args.rounds):
            for method, k in configs if r % 2 == 0 else configs[::-1]:
                name = "none" if method is None else f"{method} k={k}"
                result["runs"].setdefault(name, []).append(train(args, flash, method, k))
                print(f"dlrover round {r + 1}: {name}: {result['runs'][name][-1]['steps_per_s']:.2f} steps/s",
                      file=sys.stderr, flush=True)
        result["memory"] = memory_held(args, flash)
        result["restores"] = restores(args, flash)
    finally:
        if flash is not None:
            flash.close()
        shutil.rmtree(directory, ignore_errors=True)
        cleanup()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
