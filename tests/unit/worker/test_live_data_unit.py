"""LiveLoader's position arithmetic and rebuilds (taskd.worker.torch_data), on real DataLoaders, in-process.

The reference everywhere is what a torchrun script does: ``for epoch: sampler.set_epoch(epoch); for batch in
loader``. A rebuilt loader must continue that sequence exactly, for its own rank, without loading what it skips.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset  # noqa: E402

from taskd.worker.torch_data import DataPosition, LiveLoader, SkipFirst, position_at  # noqa: E402

WORLD, N, BATCH = 2, 22, 4  # 11 samples per rank: 3 batches per epoch (the last one short)


class Counted(Dataset):
    """Sample i is the tensor [i]; counts the samples actually loaded."""

    def __init__(self) -> None:
        self.loaded = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        self.loaded += 1
        return torch.tensor([float(i)])


def loader(rank: int, dataset: Dataset | None = None, cls: type = DataLoader, **kw) -> DataLoader:
    sampler = DistributedSampler(dataset or Counted(), num_replicas=WORLD, rank=rank, shuffle=True, seed=7)
    return cls(sampler.dataset, batch_size=BATCH, sampler=sampler, **kw)


def torchrun_order(rank: int, epochs: int) -> list[list[float]]:
    """The batches a plain torchrun loop sees, epoch after epoch."""
    dl = loader(rank)
    out = []
    for epoch in range(epochs):
        dl.sampler.set_epoch(epoch)
        out += [b.flatten().tolist() for b in dl]
    return out


def live(dl, rank: int, seed: int | None = 5) -> LiveLoader:
    return LiveLoader(dl, rank, lambda: seed)


def draw(data: LiveLoader, n: int) -> list[list[float]]:
    out = []
    for _ in range(n):
        out.append(next(data).flatten().tolist())
        data.commit()
    return out


def test_position_arithmetic() -> None:
    assert position_at(0, 3) == DataPosition(0, 0)
    assert position_at(7, 3) == DataPosition(2, 1)
    assert position_at(6, 3) == DataPosition(2, 0)
    assert position_at(5, None) == DataPosition(0, 5)
    with pytest.raises(ValueError, match="0 batches per epoch"):
        position_at(1, 0)
    with pytest.raises(ValueError, match=">= 0"):
        position_at(-1, 3)


def test_it_walks_the_epochs_as_a_torchrun_loop_does() -> None:
    data = live(loader(1), 1)
    assert len(data) == 3
    assert draw(data, 8) == torchrun_order(1, 3)[:8]
    assert data.position == DataPosition(2, 2) and (data.epoch, data.index) == (2, 2)


def test_a_replacement_resumes_a_peers_position_for_its_own_rank_without_loading_what_it_skips() -> None:
    survivor = live(loader(0), 0)
    draw(survivor, 4)  # epoch 1, batch 1 done
    next(survivor)  # the step in flight when rank 1 died...
    survivor.rollback()  # ...is abandoned
    handed = survivor.handover()
    assert (handed["epoch"], handed["index"]) == (1, 1)

    dataset = Counted()
    replacement = live(loader(1, dataset), 1)
    replacement.take(handed)
    assert draw(replacement, 4) == torchrun_order(1, 3)[4:8]
    assert dataset.loaded == 4 * BATCH - 1  # only what it drew (epoch 1's last batch is short), nothing skipped
    assert replacement.skipped_by_loading == 0
    assert replacement.resumed_by == "sampler" and survivor.resumed_by is None


def test_a_redone_step_gets_its_batches_again_and_a_survivor_keeps_its_iterator() -> None:
    dataset = Counted()
    data = live(loader(1, dataset), 1)
    draw(data, 2)
    first = [next(data).tolist(), next(data).tolist()]  # two batches in one step (accumulation)
    loaded = dataset.loaded
    data.rollback()
    data.take({"epoch": 0, "index": 2, "loader": None})  # the peer's position is ours: nothing is rebuilt
    assert [next(data).tolist(), next(data).tolist()] == first
    assert dataset.loaded == loaded
    data.commit()
    assert data.position == DataPosition(1, 1)
    assert draw(data, 2) == torchrun_order(1, 2)[4:6]


def test_a_survivor_behind_the_source_commits_the_batches_it_had_drawn() -> None:
    """The source committed step s (it failed after optimizer.step()); this rank had drawn s's batch, not committed."""
    data = live(loader(1), 1)
    draw(data, 1)
    next(data)
    data.rollback()
    data.take({"epoch": 0, "index": 2, "loader": None})
    assert data.position == DataPosition(0, 2)
    assert draw(data, 2) == torchrun_order(1, 2)[2:4]


def test_derived_from_the_step_at_a_whole_job_restart() -> None:
    data = LiveLoader(loader(1), 1, lambda: None, batches_per_step=2)
    data.derive(2)  # 2 steps of 2 batches: epoch 1, batch 1
    assert data.position == DataPosition(1, 1)
    assert draw(data, 2) == torchrun_order(1, 2)[4:6]
    with pytest.raises(ValueError, match="batches_per_step"):
        LiveLoader(loader(1), 1, lambda: None, batches_per_step=0)


def test_opening_an_iterator_leaves_the_ranks_random_stream_alone() -> None:
    """A DataLoader iterator draws its worker seed from torch's RNG: dropout after a rebuild would differ."""
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    data = live(loader(1), 1)
    next(data)
    data.take({"epoch": 2, "index": 1, "loader": None})
    next(data)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(3)
    next(DataLoader(Counted(), batch_size=2).__iter__())  # the plain loader does draw from it
    assert not torch.equal(torch.rand(3), expected)


def test_a_loader_without_a_batch_sampler_loads_and_drops_to_resume() -> None:
    sampler = DistributedSampler(Counted(), num_replicas=WORLD, rank=1, shuffle=True, seed=7)
    plain = DataLoader(sampler.dataset, batch_size=None, sampler=sampler)
    data = live(plain, 1)
    data.take({"epoch": 1, "index": 3, "loader": None})
    got = next(data).item()
    sampler.set_epoch(1)
    assert got == list(plain)[3].item()
    assert data.skipped_by_loading == 3


class Shard(IterableDataset):
    """Rank 1's shard, 5 items, reshuffled per epoch by set_epoch (no length: epochs end by StopIteration)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):  # noqa: ANN204
        order = torch.randperm(5, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter([float(10 * self.epoch + i) for i in order])


def test_an_iterable_dataset_is_resumed_by_loading_and_dropping() -> None:
    expected = []
    for epoch in range(3):
        shard = Shard()
        shard.set_epoch(epoch)
        expected += [b.tolist() for b in DataLoader(shard, batch_size=2)]  # 3 batches an epoch, the last short
    data = live(DataLoader(Shard(), batch_size=2), 1)
    assert draw(data, 7) == expected[:7]
    assert data.position == DataPosition(2, 1)  # epochs of unknown length still counted
    replacement = live(DataLoader(Shard(), batch_size=2), 1)
    replacement.take(data.handover())
    assert draw(replacement, 2) == expected[7:9]
    assert replacement.skipped_by_loading == 1 and replacement.resumed_by == "loading"


def test_the_skip_wrapper_is_used_up_and_removed() -> None:
    dl = loader(1)
    data = live(dl, 1)
    data.take({"epoch": 0, "index": 1, "loader": None})
    next(data)
    assert isinstance(dl.batch_sampler.sampler, SkipFirst)
    assert len(dl) == 3  # the wrapper keeps the epoch's length
    draw(data, 2)  # into epoch 1: a fresh iterator, the plain sampler again
    assert dl.batch_sampler.sampler is dl.sampler
    with pytest.raises(TypeError, match="already a LiveLoader"):
        live(data, 1)


def test_a_stateful_dataloader_resumes_from_a_peers_state_dict() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    survivor = live(loader(0, cls=stateful.StatefulDataLoader), 0)
    draw(survivor, 5)  # epoch 1, batch 2
    next(survivor)
    survivor.rollback()
    handed = survivor.handover()
    assert (handed["epoch"], handed["index"]) == (1, 2) and handed["loader"] is not None  # its own state_dict

    dataset = Counted()
    replacement = live(loader(1, dataset, cls=stateful.StatefulDataLoader), 1)
    replacement.take(handed)
    assert draw(replacement, 4) == torchrun_order(1, 3)[5:9]
    assert replacement.resumed_by == "state_dict"
    assert dataset.loaded == 3 + 4 + 4 + 3  # only what it drew (two short last batches): the state_dict path skips too
    assert (replacement.state_dict()["epoch"], replacement.state_dict()["index"]) == (3, 0)
