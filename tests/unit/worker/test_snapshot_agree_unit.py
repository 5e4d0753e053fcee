"""Every rank's restore calls ``agree`` (a collective) the same number of times, a rank whose snapshots are off
included: threads as the ranks of a job on several nodes, a barrier as the collective (no process, no socket).
Before, an off rank called it once while the others went on to vote and to the persisted copies' cut: a hang."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest

from taskd.worker import Snapshots
from taskd.worker import snapshot_persist as sp
from taskd.worker.env import Var
from taskd.worker.snapshot_files import segment_name

WORLD, OFF = 3, 2  # rank 2's snapshots are off; ranks 0 and 1 hold steps 1 and 2


@pytest.fixture(autouse=True)
def _ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (Var.RANK, Var.WORLD_SIZE, Var.GROUP_WORLD_SIZE, Var.TASKD_SNAPSHOT_DIR, Var.TASKD_SNAPSHOT_BYTES,
                Var.TASKD_SNAPSHOT_FAULT, Var.TASKD_SNAPSHOT_PERSIST_DIR, Var.RANK_ID, Var.RANK_SIZE,
                Var.MS_WORKER_NUM):
        monkeypatch.delenv(var, raising=False)


def state(step: int) -> dict:
    return {"w": np.full(2000, float(step)), "step": step}


class Collective:
    """``agree`` of WORLD threads: the intersection of the sets every rank offered, at a barrier; each rank's
    calls counted. A rank that calls it fewer times than the others leaves them at the barrier (broken after
    ``timeout``: the hang a real collective would be)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.barrier = threading.Barrier(WORLD, timeout=timeout)
        self.sets: list[set[int]] = [set()] * WORLD
        self.calls = [0] * WORLD

    def agree(self, rank: int, held: set[int]) -> set[int]:
        self.calls[rank] += 1
        self.sets[rank] = set(held)
        self.barrier.wait()
        common = set.intersection(*self.sets)
        self.barrier.wait()
        return common


def flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))


def job(tmp_path, monkeypatch, off: str, damaged: bool, persisted: bool, agreed: bool) -> tuple[list, list]:
    """Ranks 0 and 1 on, each on a node of its own (GROUP_WORLD_SIZE 2, or ``agreed`` as LiveGroup's one node),
    rank 2 off (``off``: "nodir", no snapshot directory, persisted copies where the others have them; "bare", no
    directory and no persisted copies' directory; "cap", turned off by its first save; "nodisk": on, holding
    nothing, without a persisted copies' directory); returns each rank's
    restore and its count of ``agree`` calls."""
    if not agreed:
        monkeypatch.setenv(Var.GROUP_WORLD_SIZE, "2")
    monkeypatch.setenv(Var.WORLD_SIZE, str(WORLD))
    disk = tmp_path / "disk"
    for rank in range(WORLD):
        monkeypatch.setenv(Var.RANK, str(rank))
        shm = tmp_path / f"shm{rank}"
        snaps = Snapshots(directory=str(shm), keep=3, background=False)
        for step in (1, 2):
            snaps.save(state(step), step)
            if persisted:  # what the agent persisted of every rank, before rank 2 was off
                sp.publish(sp.write_copy(str(shm / f"rank{rank}" / segment_name(step)), str(disk / f"rank{rank}"),
                                         rank, step), step)
        snaps.close()
    if damaged:
        flip(tmp_path / "shm1" / "rank1" / segment_name(2))
    collective, stores = Collective(), []
    for rank in range(WORLD):
        monkeypatch.setenv(Var.RANK, str(rank))
        shm, persist = str(tmp_path / f"shm{rank}"), str(disk)
        if rank == OFF and off == "cap":
            store = Snapshots(directory=shm, keep=3, background=False, cap=1, persist_dir=persist,
                              agree=lambda held, r=rank: collective.agree(r, held))
            assert store.save(state(3), 3) is False and store.off
        else:
            if rank == OFF:  # "nodisk": on, but a fresh node's (nothing in memory) and no persisted copies' directory
                shm = str(tmp_path / "fresh") if off == "nodisk" else None
                persist = None if off in ("bare", "nodisk") else persist
            store = Snapshots(directory=shm, keep=3, persist_dir=persist,
                              agree=lambda held, r=rank: collective.agree(r, held))
            assert (store.off is not None) == (rank == OFF and off != "nodisk")
        stores.append(store)
    got: list = [None] * WORLD
    errors: list = [None] * WORLD

    def run(rank: int) -> None:
        try:
            found = stores[rank].restore(agreed=agreed)
            got[rank] = (None if found is None else found[1], stores[rank].restored_from)
        except BaseException as exc:  # noqa: BLE001 - the barrier broken by a hang: said below
            errors[rank] = exc
    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), f"a rank hangs in restore: agree calls {collective.calls}"
    assert errors == [None] * WORLD, f"agree calls {collective.calls}: {errors}"
    return got, collective.calls


@pytest.mark.parametrize("agreed", [False, True], ids=["nodes", "livegroup"])
@pytest.mark.parametrize("off", ["nodir", "bare", "cap", "nodisk"])
@pytest.mark.parametrize("damaged,persisted", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["common", "damaged", "persisted", "damaged+persisted"])
def test_an_off_rank_calls_agree_as_often_as_the_others(tmp_path, monkeypatch, caplog, off, damaged, persisted,
                                                        agreed) -> None:
    """Memory holds a common step on the on ranks (or one's copy of it is damaged), persisted copies present or
    not: every rank calls ``agree`` as often, none hangs, and all restore the same step from the same place (the
    persisted copies when every rank has a directory of them, else none: no memory cut with an off rank)."""
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    got, calls = job(tmp_path, monkeypatch, off, damaged, persisted, agreed)
    assert len(set(calls)) == 1, calls
    expected = (2, "persisted") if persisted and off in ("nodir", "cap") else (None, None)
    assert got == [expected] * WORLD, got
    assert not os.path.exists(tmp_path / "disk" / "rank1" / f"{segment_name(2)}.corrupt")
    if off in ("bare", "nodisk"):  # ranks 0 and 1 have persisted copies' directory: their line says why not tried
        assert caplog.text.count("not every rank has persisted copies (TASKD_SNAPSHOT_PERSIST_DIR): none tried") == 2


def test_scope_rank_calls_no_agree_and_an_off_rank_restores_alone(tmp_path, monkeypatch) -> None:
    """Scope "rank" (ranks that exchange no state): no collective, so an off rank and on ranks never wait."""
    monkeypatch.setenv(Var.GROUP_WORLD_SIZE, "2")
    monkeypatch.setenv(Var.WORLD_SIZE, str(WORLD))
    calls = []
    for rank in range(WORLD):
        monkeypatch.setenv(Var.RANK, str(rank))
        directory = str(tmp_path / f"shm{rank}") if rank != OFF else None
        if directory:
            Snapshots(directory=directory, scope="rank", keep=1, background=False).save(state(4), 4)
        store = Snapshots(directory=directory, scope="rank", keep=1, agree=lambda held: calls.append(held) or held)
        found = store.restore()
        assert (found is None) if rank == OFF else found[1] == 4, found
    assert calls == []


def test_when_agree_fails_an_off_rank_falls_back_like_the_others(tmp_path, monkeypatch) -> None:
    """``agree`` raising SnapshotError (torch.distributed not initialized) on every rank: each falls back alike,
    the off rank too (before, its restore raised while the others fell back)."""
    from taskd.worker import SnapshotError

    monkeypatch.setenv(Var.GROUP_WORLD_SIZE, "2")
    monkeypatch.setenv(Var.WORLD_SIZE, str(WORLD))

    def agree(held: set[int]) -> set[int]:
        raise SnapshotError("torch.distributed is not initialized")
    for rank in range(WORLD):
        monkeypatch.setenv(Var.RANK, str(rank))
        directory = str(tmp_path / f"shm{rank}") if rank != OFF else None
        if directory:
            Snapshots(directory=directory, background=False).save(state(4), 4)
        store = Snapshots(directory=directory, persist_dir=str(tmp_path / "disk"), agree=agree)
        assert store.restore() is None and store.restored_from is None
