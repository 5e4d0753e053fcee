"""A PyTorch Lightning job for the snapshot callback's test: a tiny MLP, DDP over gloo on CPU under `taskd run`;
rank 1's first incarnation SIGKILLs itself after step --kill-at. Writes OUT/rank<R>.json: the step it resumed
from, where from, the final step and a digest of the weights."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from taskd import worker
from taskd.worker.lightning_snapshot import SnapshotCallback


class Net(pl.LightningModule):
    def __init__(self, kill_at: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.kill_at = kill_at
        self.before_kill = lambda: None  # the snapshot callback's publish of the step (as hf_job.py's Kill)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.trainer.global_step == self.kill_at and worker.rank() == 1 and worker.restart_count() == 0:
            self.before_kill()
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(64, 8, generator=gen), torch.randn(64, 1, generator=gen)),
                      batch_size=4, shuffle=False)
    model = Net(a.kill_at)
    snapshots = SnapshotCallback(every=1)
    model.before_kill = snapshots.snapshots.wait
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=a.steps, callbacks=[snapshots],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=os.path.join(a.out, "pl"))
    resume = snapshots.resume(trainer)
    resume_existed = resume is not None and os.path.isfile(resume)
    trainer.fit(model, data, ckpt_path=resume)
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values())).hexdigest()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"rank{worker.rank()}.json"), "w") as fh:
        json.dump({"resumed_from": int(re.findall(r"step=?(\d+)", resume)[-1]) if resume else 0, "resume": resume,
                   "resume_existed": resume_existed, "snapshot_dir": os.environ.get("TASKD_SNAPSHOT_DIR"),
                   "restored_from": snapshots.restored_from, "final": trainer.global_step,
                   "restarts": worker.restart_count(), "digest": digest}, fh)
    snapshots.close()


if __name__ == "__main__":
    main()
