"""A Hugging Face Trainer job for the snapshot callback's test: a tiny GPT-2 built from a config (no download),
DDP over gloo on CPU under `taskd run`; rank 1's first incarnation SIGKILLs itself after step --kill-at.
Writes OUT/rank<R>.json: the step it resumed from, where from, the final step and a digest of the weights."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from taskd import worker
from taskd.worker.hf_snapshot import SnapshotCallback


class Kill(TrainerCallback):
    """After step ``at`` is snapshotted and published: the save returns once the state is copied and publishes
    on a thread, and a death between the two loses that step (at most k redone, docs/worker.md); the test asserts
    that a published step is the one restored (none redone)."""

    def __init__(self, at: int, snapshots: SnapshotCallback) -> None:
        self.at = at
        self.snapshots = snapshots

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        if state.global_step == self.at and worker.rank() == 1 and worker.restart_count() == 0:
            self.snapshots.snapshots.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    gen = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (64, 16), generator=gen)]
    args = TrainingArguments(output_dir=os.path.join(a.out, "trainer"), max_steps=a.steps,
                             per_device_train_batch_size=2, learning_rate=1e-2, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", seed=3, ddp_backend="gloo",
                             disable_tqdm=True, dataloader_num_workers=0)
    snapshots = SnapshotCallback(every=1)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[snapshots, Kill(a.kill_at, snapshots)])
    resume = snapshots.resume()
    resumed_from = trainer.state.global_step
    trainer.train(resume_from_checkpoint=resume)
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values())).hexdigest()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"rank{worker.rank()}.json"), "w") as fh:
        json.dump({"resumed_from": int(resume.rsplit("checkpoint-", 1)[1].split("-")[0]) if resume else resumed_from,
                   "restored_from": snapshots.restored_from, "final": trainer.state.global_step,
                   "restarts": worker.restart_count(), "digest": digest, "resume": resume,
                   "snapshot_dir": os.environ.get("TASKD_SNAPSHOT_DIR", "")}, fh)
    snapshots.close()


if __name__ == "__main__":
    main()
