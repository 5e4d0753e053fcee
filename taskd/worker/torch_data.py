"""A DataLoader whose position a live group keeps, so a replacement resumes the dead rank's batches.

In a DDP job every rank draws the same number of batches per step from a loader of the same length
(``DistributedSampler`` pads every rank to the same share), so the position in the data, (epoch,
batches consumed in it), is the same on every rank. That is what a survivor hands a replacement with
the rest of the state; the replacement rebuilds its own rank's iterator there:

* a ``DataLoader`` with a ``BatchSampler`` (any ``batch_size``): ``set_epoch(epoch)`` on its sampler,
  then the sampler's first ``index * batch_size`` indices are skipped (no sample is loaded);
* a ``StatefulDataLoader`` (torchdata, anything with ``state_dict``/``load_state_dict``): the
  survivor's ``state_dict()`` as of the last committed step, loaded after ``set_epoch(epoch)``;
* anything else (a custom batch sampler, an ``IterableDataset``): ``index`` batches are loaded and
  dropped, said in the log.

A step that is redone (rolled back by a recovery or a retry) gets the batches it drew the first time
again, so survivors keep their iterators and their place. Creating an iterator draws the worker seed
from torch's RNG; that is done on a copy of the RNG seeded from (seed, rank, epoch), so the rank's own
random stream (dropout) is never touched by it and the worker seeds are the same whether an epoch's
iterator was opened at its start or rebuilt in its middle.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

from taskd.worker.torch_facts import step_seed

log = logging.getLogger(__name__)

__all__ = ["DataPosition", "LiveLoader", "position_at"]


class DataPosition(NamedTuple):
    """Where a rank is in its data: the epoch, and the batches of that epoch already consumed."""

    epoch: int
    index: int


def position_at(batches: int, per_epoch: int | None) -> DataPosition:
    """The position after ``batches`` batches in all, ``per_epoch`` to an epoch (None: one endless epoch)."""
    if batches < 0:
        raise ValueError(f"a data position needs batches >= 0, got {batches}")
    if per_epoch is None:
        return DataPosition(0, batches)
    if per_epoch <= 0:
        raise ValueError(f"the loader yields {per_epoch} batches per epoch: nothing to train on")
    return DataPosition(*divmod(batches, per_epoch))


class SkipFirst:
    """A sampler that leaves out the first ``skip`` indices of its next pass, then is its sampler again.

    Installed as a ``BatchSampler``'s ``sampler`` so that a rebuilt iterator starts mid-epoch without
    loading what it skips; ``len`` stays the full epoch's, as the loader's length must.
    """

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler = sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        indices = iter(self.sampler)
        collections.deque(itertools.islice(indices, skip), maxlen=0)
        return indices

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:  # set_epoch, num_replicas, ... of the sampler itself
        return getattr(self.sampler, name)


def _is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None


class _Drawn(NamedTuple):
    batch: Any
    after: DataPosition  # the position once this batch is consumed


class LiveLoader:
    """Batches of a loader, drawn with ``next()`` in a live step; made by ``LiveGroup.data(loader)``.

    It goes on from epoch to epoch by itself (``set_epoch`` on the sampler at each), so a script's
    ``for epoch ...: for batch in loader`` becomes ``next(data)`` once per step; ``epoch`` and
    ``index`` say where it is. ``state_dict()`` is for the script's own checkpoints.
    """

    def __init__(self, loader: Any, rank: int, seed: Callable[[], int | None], batches_per_step: int = 1) -> None:
        if isinstance(loader, LiveLoader):
            raise TypeError("this loader is already a LiveLoader: pass the DataLoader itself to LiveGroup.data()")
        if not isinstance(batches_per_step, int) or batches_per_step < 1:
            raise ValueError(f"batches_per_step must be an integer >= 1, got {batches_per_step!r}")
        self.loader = loader
        self.rank = rank
        self.batches_per_step = batches_per_step
        self.stateful = _is_stateful(loader)
        self._seed = seed
        self._per_epoch = _length(loader)
        self._it: Iterator[Any] | None = None
        self._it_pos = DataPosition(0, 0)  # what the next fetch from the iterator yields
        self._it_epoch: int | None = None  # the epoch the open iterator belongs to
        self._open_state: dict[str, Any] | None = None  # a StatefulDataLoader state to open the iterator from
        self._mark = DataPosition(0, 0)  # the position as of the last committed step
        self._mark_state: dict[str, Any] | None = None  # the StatefulDataLoader's state there (captured lazily)
        self._taken: list[_Drawn] = []  # handed out since the last commit
        self._ahead: collections.deque[_Drawn] = collections.deque()  # fetched, not handed out (a redo replays them)
        self.skipped_by_loading = 0  # batches loaded and dropped to reach a position (0 when skipping was cheap)
        self.resumed_by: str | None = None  # how the last mid-epoch rebuild got there: state_dict, sampler, loading

    # -- what the script sees ----------------------------------------------------------------------
    def __iter__(self) -> LiveLoader:
        return self

    def __next__(self) -> Any:
        item = self._ahead.popleft() if self._ahead else self._fetch()
        self._taken.append(item)
        return item.batch

    def __len__(self) -> int:
        if self._per_epoch is None:
            raise TypeError("the loader has no length (an IterableDataset without __len__)")
        return self._per_epoch

    @property
    def position(self) -> DataPosition:
        """The position after the batches handed out so far."""
        return self._taken[-1].after if self._taken else self._mark

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def index(self) -> int:
        return self.position.index

    def state_dict(self) -> dict[str, Any]:
        """The position as of the last committed step (and a StatefulDataLoader's state there), for checkpoints.

        A step is committed by its optimizer step: taken anywhere after it, inside ``with live.step():`` or after
        the block, this is the position the model and the optimizer stand at (issue 32, F4: taken inside the
        block it held the step before's, and every restart from it repeated a batch)."""
        if not self._taken:
            self._capture()  # the loader stands at the commit now: its own state there, while it is exact
        return {"epoch": self._mark.epoch, "index": self._mark.index, "loader": self._mark_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a position from ``state_dict()`` (e.g. in ``load(step)``); the iterator is rebuilt there."""
        self._seek(DataPosition(int(state["epoch"]), int(state["index"])), state.get("loader"))

    def close(self) -> None:
        """Drop the iterator (its worker processes end with it)."""
        self._it = None
        self._ahead.clear()
        self._taken.clear()

    # -- what LiveGroup calls ----------------------------------------------------------------------
    def commit(self) -> None:
        """The step is done: its batches are consumed for good."""
        self._mark = self.position
        self._taken.clear()
        self._mark_state = None  # captured before the next fetch, when the loader stands exactly here

    def rollback(self) -> None:
        """The step is redone: hand out the same batches again."""
        self._ahead.extendleft(reversed(self._taken))
        self._taken.clear()

    def derive(self, step: int) -> None:
        """No rank holds live state (job start, whole-job restart): the position follows from the step."""
        self._seek(position_at(step * self.batches_per_step, self._per_epoch), None)

    def handover(self) -> dict[str, Any]:
        """What a peer needs to stand where this rank stands (called after commit or rollback)."""
        self.rollback()
        self._capture()
        return self.state_dict()

    def take(self, state: dict[str, Any]) -> None:
        """Stand at a peer's position: keep the iterator when it is already there (a survivor)."""
        self.rollback()
        target = self._normal(DataPosition(int(state["epoch"]), int(state["index"])))
        if target == self._normal(self._mark):
            return
        for n, item in enumerate(self._ahead):  # the peer committed batches this rank had drawn too
            if self._normal(item.after) == target:
                for _ in range(n + 1):
                    self._ahead.popleft()
                self._mark, self._mark_state = item.after, None
                return
        self._seek(target, state.get("loader"))

    # -- the iterator ------------------------------------------------------------------------------
    def _normal(self, pos: DataPosition) -> DataPosition:
        if self._per_epoch is not None and pos.index >= self._per_epoch:
            return DataPosition(pos.epoch + pos.index // self._per_epoch, pos.index % self._per_epoch)
        return pos

    def _seek(self, pos: DataPosition, state: dict[str, Any] | None) -> None:
        pos = self._normal(pos)
        self._it = None
        self._ahead.clear()
        self._taken.clear()
        self._mark = self._it_pos = pos
        self._mark_state = self._open_state = state if pos.index else None

    def _capture(self) -> None:
        """A StatefulDataLoader's own state at the last commit, taken while its iterator stands exactly there."""
        if self.stateful and self._mark_state is None and not self._ahead and self._it is not None \
                and self._it_epoch == self._it_pos.epoch and self._it_pos.index:
            self._mark_state = self.loader.state_dict()

    def _fetch(self) -> _Drawn:
        if not self._taken:
            self._capture()
        for _ in range(2):
            if self._it is None or self._it_epoch != self._it_pos.epoch:
                self._open(self._it_pos)
            try:
                batch = next(self._it)  # type: ignore[arg-type]
            except StopIteration:  # an epoch of unknown length ended
                self._it_pos = DataPosition(self._it_pos.epoch + 1, 0)
                continue
            self._it_pos = self._normal(DataPosition(self._it_pos.epoch, self._it_pos.index + 1))
            return _Drawn(batch, self._it_pos)
        raise ValueError(f"rank {self.rank}: the loader yields no batch in epoch {self._it_pos.epoch}")

    def _open(self, pos: DataPosition) -> None:
        """An iterator of epoch ``pos.epoch`` whose next batch is number ``pos.index`` of it."""
        loader, state, self._open_state = self.loader, self._open_state, None
        self._it = None  # a multi-worker iterator's workers end before new ones start
        batch_sampler = getattr(loader, "batch_sampler", None)
        sampler = getattr(batch_sampler, "sampler", None)
        if isinstance(sampler, SkipFirst):  # a former rebuild's, its skip used up
            batch_sampler.sampler = sampler = sampler.sampler
        dataset = getattr(loader, "dataset", None)
        candidates = (getattr(loader, "sampler", None), sampler, dataset)  # an IterableDataset may have set_epoch
        for obj in {id(c): c for c in candidates if c is not None}.values():
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(pos.epoch)
        skip_by_loading = 0
        if pos.index and self.stateful and state is not None:
            loader.load_state_dict(state)
            self.resumed_by = "state_dict"
        elif pos.index and sampler is not None and isinstance(getattr(batch_sampler, "batch_size", None), int) \
                and not isinstance(dataset, torch.utils.data.IterableDataset):  # its sampler yields no index
            batch_sampler.sampler = SkipFirst(sampler, pos.index * batch_sampler.batch_size)
            self.resumed_by = "sampler"
        elif pos.index:
            skip_by_loading, self.resumed_by = pos.index, "loading"
        seed = self._seed()
        with torch.random.fork_rng(devices=[]):  # the iterator draws its workers' seed from torch's RNG
            if seed is not None:
                torch.manual_seed(step_seed(seed, self.rank, pos.epoch))
            self._it = iter(loader)
        self._it_epoch = pos.epoch
        if skip_by_loading:
            log.info("rank %d: loading and dropping %d batch(es) to resume epoch %d at batch %d (the loader has "
                     "no batch sampler whose indices can be skipped)", self.rank, skip_by_loading, pos.epoch,
                     pos.index)
            collections.deque(itertools.islice(self._it, skip_by_loading), maxlen=0)
            self.skipped_by_loading += skip_by_loading
