"""taskd.worker.Snapshots in one process: round trip, bounds, the consistent cut, damaged and unfinished segments,
the fallback, the torch adapter, and the launcher's snapshot area (no process, no socket)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from taskd.launcher.snapshots import SnapshotArea, parse_memory
from taskd.process.run_dir import OWNER_FILE
from taskd.worker import CheckpointManager, SnapshotError, Snapshots
from taskd.worker.env import Var


@pytest.fixture(autouse=True)
def _ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (Var.RANK, Var.WORLD_SIZE, Var.GROUP_WORLD_SIZE, Var.TASKD_SNAPSHOT_DIR, Var.TASKD_SNAPSHOT_BYTES,
                Var.TASKD_SNAPSHOT_FAULT, Var.RANK_ID, Var.RANK_SIZE, Var.MS_WORKER_NUM):
        monkeypatch.delenv(var, raising=False)


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    monkeypatch.setenv(Var.RANK, str(rank))
    monkeypatch.setenv(Var.WORLD_SIZE, str(world))


def state(step: int) -> dict:
    return {"w": np.full(1000, float(step)), "m": np.arange(7, dtype=np.int16) + step, "step": step, "tag": "x"}


def files(directory, rank: int = 0) -> list[str]:
    return sorted(os.listdir(os.path.join(directory, f"rank{rank}")))


def test_round_trip_keeps_arrays_and_small_objects_bit_for_bit(tmp_path) -> None:
    snaps = Snapshots(directory=str(tmp_path), background=False)
    original = state(3)
    assert snaps.save(original, 3) is True
    got, step = Snapshots(directory=str(tmp_path)).restore()
    assert step == 3 and got["step"] == 3 and got["tag"] == "x"
    for key in ("w", "m"):
        assert got[key].dtype == original[key].dtype and got[key].tobytes() == original[key].tobytes()
    got["w"][0] = -1.0  # restored arrays are the restorer's own (writable, not the segment)
    assert Snapshots(directory=str(tmp_path)).restore()[0]["w"][0] == 3.0


def test_a_rank_holds_at_most_keep_published_plus_one_segment(tmp_path) -> None:
    snaps = Snapshots(keep=2, directory=str(tmp_path))
    for step in range(1, 8):
        snaps.save(state(step), step)
    snaps.wait()
    names = files(tmp_path)
    assert [n for n in names if n.endswith(".snap")] == ["s000000000006.snap", "s000000000007.snap"]
    assert len(names) == 3  # one free segment, reused by the next save


def test_the_cut_is_the_newest_step_every_rank_holds(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rank, steps in ((0, (4, 5)), (1, (5, 6)), (2, (5, 6))):
        as_rank(monkeypatch, rank, 3)
        snaps = Snapshots(directory=str(tmp_path), background=False)
        for step in steps:
            snaps.save(state(step), step)
    as_rank(monkeypatch, 1, 3)
    restored = Snapshots(directory=str(tmp_path))
    got, step = restored.restore()
    assert step == 5 and got["step"] == 5 and restored.restored_from == "memory"
    assert files(tmp_path, 1) == ["s000000000005.snap"]  # step 6 was past the cut: dropped
    # scope "rank" takes this rank's own newest instead
    as_rank(monkeypatch, 2, 3)
    assert Snapshots(scope="rank", keep=1, directory=str(tmp_path)).restore()[1] == 6


def test_across_nodes_the_cut_is_what_agree_says_every_rank_holds(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog) -> None:
    """A rank on one of several nodes sees its own node only: the step comes from ``agree`` (the collective)."""
    as_rank(monkeypatch, 2, 4)
    monkeypatch.setenv(Var.GROUP_WORLD_SIZE, "2")
    snaps = Snapshots(keep=3, directory=str(tmp_path), background=False)
    for step in (4, 5, 6):
        snaps.save(state(step), step)
    asked: list[set[int]] = []

    def agree(steps: set[int]) -> set[int]:
        asked.append(steps)
        return steps & {3, 4, 5}  # the other node's ranks (or the buddy's copy of them) hold 3-5
    restored = Snapshots(keep=3, directory=str(tmp_path), agree=agree)
    assert restored.restore()[1] == 5
    steps = [{s for s in held if s >= 0} for held in asked]  # a ballot's bit marks are negative
    assert steps == [{4, 5, 6}, {5}]  # the step, then the vote: every copy passed
    assert files(tmp_path, 2) == ["s000000000004.snap", "s000000000005.snap"]
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    assert Snapshots(directory=str(tmp_path), agree=lambda steps: set()).restore() is None
    assert "no step is held by every rank of the job (2 node(s)" in caplog.text
    assert Snapshots(directory=str(tmp_path)).restore() is None  # nothing to agree with: never a guess
    assert "the job runs on 2 nodes and nothing agrees on a step across them" in caplog.text
    off: list[set[int]] = []
    Snapshots(directory=None, agree=lambda steps: off.append(steps) or set()).restore()
    assert off == [set()]  # a rank whose snapshots are off still takes part in the others' collective


def test_no_common_step_restores_nothing_and_says_why(tmp_path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    as_rank(monkeypatch, 0, 2)
    Snapshots(directory=str(tmp_path), background=False).save(state(1), 1)
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    assert Snapshots(directory=str(tmp_path)).restore() is None
    assert "rank(s) 1 hold no snapshot" in caplog.text
    as_rank(monkeypatch, 1, 2)
    snaps = Snapshots(directory=str(tmp_path), background=False)
    snaps.save(state(3), 3)
    snaps.save(state(4), 4)
    assert snaps.restore() is None
    assert "no step is held by every rank (newest rank 0: 1, rank 1: 4)" in caplog.text


def test_an_unfinished_segment_is_never_restored_and_is_removed(tmp_path) -> None:
    Snapshots(directory=str(tmp_path), background=False).save(state(1), 1)
    own = tmp_path / "rank0"
    (own / ".free-9-abc").write_bytes(b"\0" * 64 + b"half a copy")  # what a rank killed inside the copy leaves
    snaps = Snapshots(directory=str(tmp_path))
    assert files(tmp_path) == ["s000000000001.snap"]
    assert snaps.restore()[1] == 1


def test_a_damaged_segment_falls_back_to_disk_saying_so(tmp_path, caplog) -> None:
    ckpt = CheckpointManager(tmp_path / "ckpt")
    ckpt.save(state(2), 2)
    shm = tmp_path / "shm"
    Snapshots(directory=str(shm), background=False).save(state(5), 5)
    segment = shm / "rank0" / "s000000000005.snap"
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))
    snaps = Snapshots(directory=str(shm), fallback=ckpt)
    got, step = snaps.restore()
    assert step == 2 and got["step"] == 2 and snaps.restored_from == "disk"
    assert "checksum mismatch" in caplog.text and f"falling back to the disk checkpoints in {ckpt.directory}" \
        in caplog.text


def flip(segment) -> None:
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))


def test_one_node_without_a_vote_every_rank_passes_a_damaged_copy_over(tmp_path, monkeypatch, caplog) -> None:
    """No ``agree`` (one node, nothing to vote through): each rank checks every rank's copy of the step, so rank 0,
    whose own copy of step 2 is intact, takes step 1 with rank 1, whose copy is one byte off (before: 2 and disk)."""
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        snaps = Snapshots(directory=str(tmp_path), background=False)
        for step in (1, 2):
            snaps.save(state(step), step)
    flip(tmp_path / "rank1" / "s000000000002.snap")
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    got = []
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        snaps = Snapshots(directory=str(tmp_path))
        got.append((snaps.restore()[1], snaps.restored_from))
    assert got == [(1, "memory"), (1, "memory")]
    assert "rank 0 restored step 1 from memory" in caplog.text and "newer steps passed over on every rank: step " \
        "2: rank 1's snapshot fails its check (" in caplog.text and "checksum mismatch" in caplog.text


def test_with_a_vote_each_rank_checks_its_own_and_nothing_is_applied_before_it(tmp_path, monkeypatch,
                                                                              caplog) -> None:
    """``agree`` (one node: the adapters' collective; here threads at a barrier): each rank checks only its own copy,
    then votes; rank 0's ``use`` never sees the step rank 1's damaged copy made every rank pass over."""
    import threading

    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        snaps = Snapshots(directory=str(tmp_path), background=False)
        for step in (1, 2):
            snaps.save(state(step), step)
    flip(tmp_path / "rank1" / "s000000000002.snap")
    barrier, sets, asked = threading.Barrier(2, timeout=30), [set(), set()], [[], []]
    stores = []
    for rank in (0, 1):
        as_rank(monkeypatch, rank, 2)
        stores.append(Snapshots(directory=str(tmp_path), agree=lambda held, r=rank: vote(r, held)))

    def vote(rank: int, held: set[int]) -> set[int]:
        asked[rank].append(held)
        sets[rank] = held
        barrier.wait()
        common = sets[0] & sets[1]
        barrier.wait()
        return common
    applied, got = [[], []], [None, None]

    def run(rank: int) -> None:
        got[rank] = stores[rank].restore(use=lambda s, r=rank: applied[r].append(s["step"]))[1]
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [1, 1] and applied == [[1], [1]], (got, applied)
    steps = [[{s for s in held if s >= 0} for held in ballots] for ballots in asked]
    assert steps == [[{2}, {1}], [set(), {1}]]  # one vote per step tried; the step itself from the files
    assert "rank 1: its snapshot of step 2 in memory fails its check (" in caplog.text and "checksum mismatch" in \
        caplog.text and "step 2: rank 1's snapshot fails its check (its line says why)" in caplog.text


@pytest.mark.parametrize("failing", [(0,), (5,), (3,), (2, 6), (1, 2, 7)])
def test_the_vote_names_the_one_failing_rank_or_says_several(failing) -> None:
    """The ballots' intersection (what any ``agree`` returns) spells the failing rank's number, so a passing rank's
    line names it; several failing ranks are told apart from one (before: "another rank" whatever failed)."""
    from taskd.worker.snapshot_ballot import ballot, failing_rank

    voted = set.intersection(*(ballot(rank not in failing, 9, rank) for rank in range(8)))
    assert 9 not in voted
    assert failing_rank(voted) == (failing[0] if len(failing) == 1 else None)
    assert 9 in set.intersection(*(ballot(True, 9, rank) for rank in range(8)))


def test_a_truncated_segment_is_never_restored(tmp_path, caplog) -> None:
    Snapshots(directory=str(tmp_path), background=False).save(state(5), 5)
    segment = tmp_path / "rank0" / "s000000000005.snap"
    os.truncate(segment, 4000)  # the body (8 KB of arrays) cut in half
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    assert Snapshots(directory=str(tmp_path)).restore() is None
    assert "bytes early (truncated?)" in caplog.text


def test_restore_with_use_hands_it_views_of_the_segment_that_never_write_back(tmp_path) -> None:
    Snapshots(directory=str(tmp_path), background=False).save(state(3), 3)
    seen = []

    def use(got: dict) -> str:
        seen.append(got["w"].tobytes())
        got["w"][:] = -1.0  # a private mapping: the segment keeps what was saved
        return "used"

    assert Snapshots(directory=str(tmp_path)).restore(use=use) == ("used", 3)

    calls = []

    def fails(got: dict) -> None:  # its error passes through: never taken for a damaged segment (no fallback)
        calls.append(got["step"])
        if len(calls) == 1:
            raise OSError("the caller's own")

    ckpt = CheckpointManager(tmp_path / "ckpt")
    ckpt.save(state(1), 1)
    with pytest.raises(OSError, match="the caller's own"):
        Snapshots(directory=str(tmp_path), fallback=ckpt).restore(use=fails)
    assert calls == [3]
    assert seen == [state(3)["w"].tobytes()]
    assert Snapshots(directory=str(tmp_path)).restore()[0]["w"].tobytes() == state(3)["w"].tobytes()


def test_a_cap_too_small_turns_snapshots_off_with_the_fallback_named(tmp_path, caplog) -> None:
    ckpt = CheckpointManager(tmp_path / "ckpt")
    Snapshots(directory=str(tmp_path / "shm"), background=False).save(state(1), 1)
    snaps = Snapshots(directory=str(tmp_path / "shm"), cap=100_000, fallback=ckpt, background=False)
    assert snaps.save(state(1), 1) is False  # 8 KB, in 64 KiB segments: 2 kept + 1 written = 192 KiB > 100 KB
    assert snaps.off is not None and "above this rank's share of the job's snapshot memory" in snaps.off
    assert "TASKD_SNAPSHOT_MEMORY" in caplog.text and f"falls back to the disk checkpoints in {ckpt.directory}" \
        in caplog.text
    assert os.listdir(tmp_path / "shm" / "rank0") == []  # what it held is given back
    assert snaps.save(state(2), 2) is False
    assert snaps.restore() is None and snaps.restored_from is None  # nothing on disk either: a fresh start


def test_outside_taskd_save_does_nothing_and_restore_uses_the_fallback(tmp_path) -> None:
    ckpt = CheckpointManager(tmp_path / "ckpt")
    ckpt.save(state(4), 4)
    snaps = Snapshots(fallback=ckpt)
    assert snaps.save(state(5), 5) is False and "TASKD_SNAPSHOT_DIR" in (snaps.off or "")
    assert snaps.restore()[1] == 4 and snaps.restored_from == "disk"


def test_bad_arguments_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="keep must be an integer >= 2"):
        Snapshots(keep=1, directory=str(tmp_path))
    with pytest.raises(ValueError, match="scope must be one of job, rank"):
        Snapshots(scope="node", directory=str(tmp_path))
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        Snapshots(directory=str(tmp_path)).save({}, -1)
    with pytest.raises(SnapshotError, match="cannot be snapshotted"):
        Snapshots(directory=str(tmp_path)).save({"f": lambda: 1}, 1)


def test_the_torch_adapter_restores_model_and_optimizer_exactly(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from taskd.worker.torch_snapshot import TorchSnapshots

    def make() -> tuple:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4).to(torch.bfloat16)
        return model, torch.optim.AdamW(model.parameters())

    model, opt = make()
    model(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    TorchSnapshots(model, opt, directory=str(tmp_path), background=False).save(1, extra={"epoch": 3})
    model2, opt2 = make()
    snaps = TorchSnapshots(model2, opt2, directory=str(tmp_path))
    assert snaps.restore() == 1 and snaps.extra == {"epoch": 3}
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)
    state1, state2 = opt.state_dict()["state"][0], opt2.state_dict()["state"][0]
    assert all(torch.equal(state1[k], state2[k]) for k in state1)
    # what the objects hold is their own: the segment zeroed (as its reuse by a later snapshot would) moves nothing
    segment = tmp_path / "rank0" / "s000000000001.snap"
    segment.write_bytes(b"\0" * segment.stat().st_size)
    state2 = opt2.state_dict()["state"][0]
    assert all(torch.equal(state1[k], state2[k]) for k in state1)
    pairs = zip(model.state_dict().values(), model2.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_parse_memory() -> None:
    assert parse_memory("1000") == 1000 and parse_memory("2G") == 2 << 30 and parse_memory("512MiB") == 512 << 20
    with pytest.raises(ValueError, match="TASKD_SNAPSHOT_MEMORY='lots'"):
        parse_memory("lots")


def test_the_area_removes_a_dead_agents_directory_and_its_own_at_close(tmp_path) -> None:
    stale = tmp_path / "taskd-snap-old-abc"
    (stale / "rank0").mkdir(parents=True)
    (stale / "rank0" / "s000000000001.snap").write_bytes(b"x" * 10)
    area0 = SnapshotArea("probe", 1, {}, root=str(tmp_path))  # an owner record of this host, then its pid made dead
    owner = json.loads((tmp_path / os.path.basename(area0.path) / OWNER_FILE).read_text())
    area0.close()
    (stale / OWNER_FILE).write_text(json.dumps({**owner, "pid": 2 ** 22 + 1}))
    area = SnapshotArea("job", 4, {Var.TASKD_SNAPSHOT_MEMORY: "4M"}, root=str(tmp_path))
    assert not stale.exists()
    assert area.env() == {Var.TASKD_SNAPSHOT_DIR: area.path, Var.TASKD_SNAPSHOT_BYTES: str(1 << 20),
                          Var.TASKD_SNAPSHOT_PINS: "0"}
    area.close()
    assert os.listdir(tmp_path) == []
    assert SnapshotArea("off", 1, {Var.TASKD_SNAPSHOT_MEMORY: "0"}, root=str(tmp_path)).env() == {}


def test_a_directory_whose_agent_died_after_this_area_was_made_is_removed_at_its_close(tmp_path) -> None:
    """A node's whole `taskd run` SIGKILLed while a standby on the same host (started before it) took its place:
    no agent starts after the death, so the job's end must sweep its directory (the replication e2e saw it left)."""
    area = SnapshotArea("job", 1, {Var.TASKD_SNAPSHOT_MEMORY: "4M"}, root=str(tmp_path))
    owner = json.loads((tmp_path / os.path.basename(area.path) / OWNER_FILE).read_text())
    dead = tmp_path / "taskd-snap-job-dead"
    (dead / "rank0").mkdir(parents=True)
    (dead / OWNER_FILE).write_text(json.dumps({**owner, "pid": 2 ** 22 + 1}))  # made after the area's start sweep
    area.close()
    assert os.listdir(tmp_path) == []


def test_the_run_flags_memory_goes_before_the_variable_and_a_bad_one_is_refused(tmp_path) -> None:
    from taskd.launcher import WorkerSpec

    area = SnapshotArea("job", 4, {Var.TASKD_SNAPSHOT_MEMORY: "1G"}, root=str(tmp_path), memory="8M")
    assert area.env()[Var.TASKD_SNAPSHOT_BYTES] == str(2 << 20)
    area.close()
    assert SnapshotArea("off", 1, {Var.TASKD_SNAPSHOT_MEMORY: "1G"}, root=str(tmp_path), memory="0").env() == {}
    assert WorkerSpec(["true"], snapshot_memory="2G").snapshot_memory == "2G"
    with pytest.raises(ValueError, match=r"snapshot_memory \(--snapshot-memory\) must be bytes"):
        WorkerSpec(["true"], snapshot_memory="lots")


def test_a_step_fetched_from_the_buddy_restores_as_buddy_and_the_agent_is_told(tmp_path) -> None:
    """A replacement's agent marks what it fetched (snapshot_account): the rank's restore of that step says
    "buddy", in `restored_from` and in the record its agent reads; the mark is taken, so its next restore, from
    the node's own memory, says "memory"."""
    from taskd.worker.snapshot_account import Fetched, mark_fetched, read_restored

    snaps = Snapshots(directory=str(tmp_path), background=False)
    for step in (3, 4):
        snaps.save(state(step), step)
    mark_fetched(str(tmp_path), 0, Fetched(node=0, holder=1, steps=(3, 4)))
    again = Snapshots(directory=str(tmp_path))
    assert again.restore()[1] == 4 and again.restored_from == "buddy"
    said = read_restored(str(tmp_path), 0)
    assert (said.source, said.step, said.newest, said.holder, said.pid) == ("buddy", 4, 4, 1, os.getpid())
    assert said.redone == 0
    later = Snapshots(directory=str(tmp_path))
    assert later.restore()[1] == 4 and later.restored_from == "memory"
    assert read_restored(str(tmp_path), 0).source == "memory"


def test_a_lost_ranks_restore_from_the_buddy_counts_the_steps_it_had_reached_past_the_copy(tmp_path) -> None:
    """Scope "rank": a lost rank restores its own newest fetched copy (step 4), but it had reached step 9, as its
    node's agent last reported: 5 steps redone, not the 0 its fetched copies alone say (no cut's other ranks can
    tell for this scope)."""
    from taskd.worker.snapshot_account import Fetched, mark_fetched, read_restored

    snaps = Snapshots(scope="rank", directory=str(tmp_path), background=False)
    for step in (3, 4):
        snaps.save(state(step), step)
    mark_fetched(str(tmp_path), 0, Fetched(node=1, holder=0, steps=(3, 4), newest=9))
    assert Snapshots(scope="rank", directory=str(tmp_path)).restore()[1] == 4
    said = read_restored(str(tmp_path), 0)
    assert (said.source, said.step, said.newest, said.redone) == ("buddy", 4, 9, 5)


def test_a_fallback_the_agent_explained_says_both_copies_are_lost(tmp_path, caplog) -> None:
    """Issue 33: when a replacement's agent found no copy of the lost node's snapshots (its buddy lost too), the
    rank's fallback to disk says so in the agent's words, not a guess about `keep`."""
    from taskd.worker.snapshot_account import Fetched, mark_fetched, read_restored

    ckpt = CheckpointManager(str(tmp_path / "ckpt"))
    ckpt.save(state(2), 2)
    why = "no buddy copy of node 1's snapshots survives (no agent holds a copy of it)"
    mark_fetched(str(tmp_path), 0, Fetched(node=1, holder=-1, steps=(), why=why))
    with caplog.at_level("INFO", logger="taskd.worker"):
        assert Snapshots(directory=str(tmp_path), fallback=ckpt).restore()[1] == 2
    assert f"(node 1 was lost with its snapshots, and {why}): falling back to" in caplog.text, caplog.text
    assert read_restored(str(tmp_path), 0).source == "disk"


def test_the_record_counts_the_steps_past_the_cut_and_a_disk_fallback(tmp_path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    from taskd.worker.snapshot_account import read_restored

    for rank, steps in ((0, (4, 5, 6)), (1, (3, 4))):
        as_rank(monkeypatch, rank, 2)
        snaps = Snapshots(keep=3, directory=str(tmp_path), background=False)
        for step in steps:
            snaps.save(state(step), step)
    as_rank(monkeypatch, 0, 2)
    assert Snapshots(keep=3, directory=str(tmp_path)).restore()[1] == 4
    said = read_restored(str(tmp_path), 0)
    assert (said.source, said.step, said.newest, said.redone) == ("memory", 4, 6, 2)
    ckpt = CheckpointManager(str(tmp_path / "ckpt"))
    ckpt.save(state(2), 2)
    as_rank(monkeypatch, 1, 2)
    (tmp_path / "rank1" / "s000000000004.snap").unlink()  # no common step any more
    (tmp_path / "rank1" / "s000000000003.snap").unlink()
    assert Snapshots(directory=str(tmp_path), fallback=ckpt).restore()[1] == 2
    assert read_restored(str(tmp_path), 1).source == "disk"


def test_live_group_snapshot_options_are_checked_before_anything_and_off_means_the_disk() -> None:
    """LiveGroup(snapshot_every=..., snapshot_keep=...) refuses bad values at once; with snapshots off a start
    where no rank holds live state loads the lowest step the ranks' checkpoints share (torch_live_snapshot)."""
    torch = pytest.importorskip("torch")
    from taskd.worker.torch import LiveGroup
    from taskd.worker.torch_live_snapshot import LiveSnapshots, start_afresh

    for every, keep in ((-1, 4), (1, 1), ("1", 4)):
        with pytest.raises(ValueError, match="snapshot_every must be an integer >= 0 and snapshot_keep one >= 2"):
            LiveGroup(snapshot_every=every, snapshot_keep=keep)
    loaded: list[int] = []
    cpu = torch.device("cpu")
    assert start_afresh(LiveSnapshots(0), 0, [(0, 4), (0, 2)], [], loaded.append, cpu) == 2 and loaded == [2]
    with pytest.raises(RuntimeError, match="ranks would start at different steps"):
        start_afresh(LiveSnapshots(0), 0, [(0, 4), (0, 2)], [], None, cpu)


def sum_only_intersection(sets: list[set[int]]) -> set[int]:
    """`taskd.worker.mindspore.common_steps` with its two AllReduces (MindSpore's CPU one sums float32 only) as sums
    over the ranks' arrays; each array as big whatever the number of ranks."""
    from taskd.worker.snapshot_ballot import common, holds, offer, offered

    offers = [offer(held, rank) for rank, held in enumerate(sets)]
    assert all(o.dtype == np.float32 and o.nbytes == 2048 for o in offers)
    candidates = offered(sum(offers))
    counts = [holds(candidates, held) for held in sets]
    assert all(c.dtype == np.float32 and c.nbytes == 512 for c in counts)
    return common(candidates, sum(counts), len(sets))


def test_a_sum_only_collective_carries_each_ranks_set_and_the_ballot() -> None:
    """Two sums of a few KB (rank 0's set offered, then how many ranks hold each of its values) give the ranks' sets'
    intersection exactly (steps past float32's 2**24, the ballot's negative marks), and the failing rank's number."""
    from taskd.worker.snapshot_ballot import SLOTS, ballot, failing_rank, offer

    sets = [{4, 5, 2**40 + 7}, {5, 2**40 + 7, 9}, {2**40 + 7, 5}]
    assert sum_only_intersection(sets) == {5, 2**40 + 7} == set.intersection(*sets)
    assert sum_only_intersection([{5, 9}, {4, 5, 2**40 + 7, 9}, {9, 1}]) == {9}  # values rank 0 lacks are in none
    voted = sum_only_intersection([ballot(rank != 2, 2**30, rank) for rank in range(3)])
    assert 2**30 not in voted and failing_rank(voted) == 2
    assert failing_rank(sum_only_intersection([ballot(rank != 5, 7, rank) for rank in range(6)])) == 5
    assert sum_only_intersection([set() if r else {1} for r in range(2)]) == set()
    assert sum_only_intersection([set(), {1}]) == set()
    assert sum_only_intersection([{3}]) == {3}
    with pytest.raises(ValueError, match="at most"):
        offer(set(range(SLOTS + 1)), 1)  # every rank refuses alike, not only rank 0
    with pytest.raises(ValueError, match="cannot be agreed on"):
        offer({-(1 << 17)}, 1)


def test_msrun_on_two_nodes_restores_from_memory_only_with_a_vote(tmp_path, monkeypatch, caplog) -> None:
    """msrun sets no node count (GROUP_WORLD_SIZE): a rank sees its node's directory only. Without ``agree`` no rank
    has a cut (each misses the other node's ranks: alike on every rank, none restores); with the MindSpore
    callback's (``agreed``, MindSpore's AllReduce; threads here) every rank takes step 1, rank 3's copy of step 2
    being damaged, and rank 0's line names rank 3."""
    import threading

    monkeypatch.setenv(Var.RANK_SIZE, "4")
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for rank in range(4):
        monkeypatch.setenv(Var.RANK_ID, str(rank))
        snaps = Snapshots(directory=str(nodes[rank // 2]), background=False)
        for step in (1, 2):
            snaps.save(state(step), step)
    flip(nodes[1] / "rank3" / "s000000000002.snap")
    caplog.set_level(logging.INFO, "taskd.worker.snapshot")
    monkeypatch.setenv(Var.RANK_ID, "0")
    assert Snapshots(directory=str(nodes[0])).restore() is None
    assert "rank(s) 2, 3 hold no snapshot" in caplog.text
    barrier, sets = threading.Barrier(4, timeout=30), [set()] * 4

    def vote(rank: int, held: set[int]) -> set[int]:
        sets[rank] = held
        barrier.wait()
        common = set.intersection(*sets)
        barrier.wait()
        return common
    stores = []
    for rank in range(4):
        monkeypatch.setenv(Var.RANK_ID, str(rank))
        stores.append(Snapshots(directory=str(nodes[rank // 2]), agree=lambda held, r=rank: vote(r, held)))
    got: list = [None] * 4
    threads = [threading.Thread(target=lambda r=r: got.__setitem__(r, stores[r].restore(agreed=True)[1]))
               for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [1, 1, 1, 1], got
    assert "step 2: rank 3's snapshot fails its check (its line says why)" in caplog.text
