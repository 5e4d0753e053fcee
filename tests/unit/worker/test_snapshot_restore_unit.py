"""The snapshots' checksum: zlib-ng's CRC-32 where it is installed, the same values as zlib's (so a segment, a
buddy's copy or a persisted copy checks either way), and what a restore copies into (no process, no socket)."""

from __future__ import annotations

import mmap
import zlib

import numpy as np
import pytest

from taskd.worker import snapshot_segment


def test_the_checksum_is_zlibs_crc32_chunk_by_chunk_and_over_a_mapping(tmp_path) -> None:
    data = np.random.default_rng(7).integers(0, 256, 3 * (1 << 20) + 13, dtype=np.uint8).tobytes()
    assert snapshot_segment.crc32(data) == zlib.crc32(data)
    crc = 0
    for start in range(0, len(data), 1 << 20):  # how the agent checks a copy: chunk by chunk, carried on
        crc = snapshot_segment.crc32(data[start:start + (1 << 20)], crc)
    assert crc == zlib.crc32(data)
    path = tmp_path / "body"
    path.write_bytes(data)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        view = memoryview(mapped)
        assert snapshot_segment.crc32(view[5:]) == zlib.crc32(data[5:])  # how a restore checks: the mapped body
        view.release()


def test_zlib_ngs_crc32_is_used_where_it_is_installed() -> None:
    fast = pytest.importorskip("zlib_ng.zlib_ng")
    assert snapshot_segment.crc32 is fast.crc32  # 4-5x less CPU than zlib's per snapshot (BENCHMARKS.md)


def _stepped(torch, lr: float = 1e-3, seed: int = 0) -> tuple:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model(torch.randn(4, 6)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_restore_copies_into_the_optimizer_state_it_holds_and_allocates_none(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from taskd.worker.torch_snapshot import TorchSnapshots

    model, optimizer = _stepped(torch, seed=1)
    TorchSnapshots(model, optimizer, directory=str(tmp_path), background=False).save(4)
    model2, optimizer2 = _stepped(torch, lr=0.5, seed=2)  # a process that trained on: its state differs
    held = {(i, k): t for i, entry in optimizer2.state_dict()["state"].items() for k, t in entry.items()}
    assert TorchSnapshots(model2, optimizer2, directory=str(tmp_path)).restore() == 4
    now = optimizer2.state_dict()
    for (i, k), tensor in held.items():
        assert now["state"][i][k] is tensor  # the same tensors, refilled: nothing re-created
        assert torch.equal(tensor, optimizer.state_dict()["state"][i][k])
    assert now["param_groups"][0]["lr"] == 1e-3
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_an_optimizer_state_its_load_refuses_changes_nothing() -> None:
    torch = pytest.importorskip("torch")
    from taskd.worker.torch_snapshot import optimizer_state

    _, optimizer = _stepped(torch, seed=1)
    _, other = _stepped(torch, seed=2)
    saved = other.state_dict()
    saved["param_groups"][0]["params"] = saved["param_groups"][0]["params"][:3]  # a group of another size
    before = {(i, k): t.clone() for i, entry in optimizer.state_dict()["state"].items() for k, t in entry.items()}
    with pytest.raises(ValueError, match="size"):
        optimizer.load_state_dict(optimizer_state(optimizer, saved))
    after = optimizer.state_dict()["state"]
    assert all(torch.equal(after[i][k], t) for (i, k), t in before.items())


def test_every_adapter_and_example_defaults_to_the_measured_interval() -> None:
    """One default k (snapshot.DEFAULT_EVERY, chosen from bench/snapshots.py's CPU cost): ≤ 10 (issue 33), and what
    the callbacks' ``every`` and the examples' --snapshot-every default to (read from their source: no framework
    imported)."""
    import ast
    from pathlib import Path

    from taskd.worker.snapshot import DEFAULT_EVERY

    assert isinstance(DEFAULT_EVERY, int) and 1 <= DEFAULT_EVERY <= 10
    root = Path(__file__).resolve().parents[3]
    defaults = {}
    for path in ("taskd/worker/hf_snapshot.py", "taskd/worker/lightning_snapshot.py", "taskd/worker/mindspore.py"):
        tree = ast.parse((root / path).read_text())
        init = next(f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "SnapshotCallback"
                    for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        names = [a.arg for a in init.args.kwonlyargs]
        default = init.args.kw_defaults[names.index("every")] if "every" in names else \
            init.args.defaults[[a.arg for a in init.args.args][-len(init.args.defaults):].index("every")]
        defaults[path] = ast.unparse(default)
    for path in ("examples/torch/train_plain.py", "examples/torch/train_fsdp2.py"):
        tree = ast.parse((root / path).read_text())
        call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args and
                    isinstance(n.args[0], ast.Constant) and n.args[0].value == "--snapshot-every")
        defaults[path] = ast.unparse(next(k.value for k in call.keywords if k.arg == "default"))
    assert set(defaults.values()) == {"DEFAULT_EVERY"}, defaults


class _OneRank:
    """torch.distributed as a group of one rank sees it (no process group in this tier)."""

    @staticmethod
    def get_world_size() -> int:
        return 1

    @staticmethod
    def all_gather(table: list, mine) -> None:  # noqa: ANN001
        table[0].copy_(mine)


def test_a_live_groups_restore_copies_the_state_once_straight_into_the_model(tmp_path, monkeypatch) -> None:
    """LiveGroup's whole-job restart (torch_live_snapshot): the state went from the segment into copies of its own,
    then into the model and optimizer, twice the copying of `TorchSnapshots.restore`. It is loaded from views of
    the mapped segment now, once every rank said it holds the step."""
    torch = pytest.importorskip("torch")
    from taskd.worker import torch_live_snapshot
    from taskd.worker.env import Var

    monkeypatch.setenv(Var.TASKD_SNAPSHOT_DIR, str(tmp_path))
    monkeypatch.setenv(Var.RANK, "0")
    monkeypatch.setenv(Var.WORLD_SIZE, "1")
    monkeypatch.setattr(torch_live_snapshot, "dist", _OneRank)
    model, optimizer = _stepped(torch)
    live = torch_live_snapshot.LiveSnapshots(every=1, keep=2)
    live.start([model, optimizer], None)
    live.save(3)
    live.close()
    want = [p.detach().clone() for p in model.parameters()]
    moment = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        optimizer.state_dict()["state"][0]["exp_avg"].zero_()
    copies: list[bool] = []
    rebuild = snapshot_segment._rebuild
    monkeypatch.setattr(snapshot_segment, "_rebuild", lambda *a, copy: copies.append(copy) or rebuild(*a, copy=copy))
    again = torch_live_snapshot.LiveSnapshots(every=1, keep=2)
    again.start([model, optimizer], None)
    assert again.restore(0, 0, torch.device("cpu")) == 3 and again.restored_from == "memory"
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), want, strict=True))
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moment)
    assert copies == [False]  # views of the segment: the one copy is the load's
    again.close()


def test_the_crc_taken_during_the_copy_covers_the_whole_body_stale_padding_included(tmp_path) -> None:
    rng = np.random.default_rng(3)  # buffers of odd sizes (padding between them), two over a piece (1 MB)
    state = {"a": rng.integers(0, 256, (1 << 20) * 2 + 7, dtype=np.uint8), "b": np.arange(5, dtype=np.int8),
             "c": rng.standard_normal(300_001), "n": 4}
    flat = snapshot_segment.flatten(state)
    path = tmp_path / "seg"
    path.write_bytes(b"\xa5" * flat.size)  # a reused segment: its padding holds an older snapshot's bytes
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), flat.size) as mapped:
        view = memoryview(mapped)
        length, crc = snapshot_segment.write_body(view, flat)
        assert crc == zlib.crc32(view[snapshot_segment.HEADER_SIZE:snapshot_segment.HEADER_SIZE + length])
        snapshot_segment.seal(view, 9, 0, 1, length, len(flat.skeleton), len(flat.buffers), crc)
        view.release()
    got, _ = snapshot_segment.load(str(path), 9, 0)
    assert got["n"] == 4 and all(got[k].tobytes() == state[k].tobytes() for k in "abc")
