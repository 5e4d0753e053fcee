"""bench/goodput.py --job: the DDP job stays the default and unchanged; the HSDP job runs bench/sharded_live.py's own
systems (not copies), skips every other system with a one-line reason, starts them with goodput's restart budget
and hang detection, and reads its runs from the ranks' .computed lines and final shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from support.bench import load_bench

gp = load_bench("goodput")
jobs = load_bench("goodput_jobs")
sharded = load_bench("sharded_live")


def _args(monkeypatch: pytest.MonkeyPatch, *argv: str) -> argparse.Namespace:
    monkeypatch.setattr(sys, "argv", ["goodput.py", *argv])
    return gp.parse_args()


def test_ddp_is_the_default_and_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(monkeypatch)
    assert args.job == "ddp" and args.ranks == 4 and args.hidden == 0
    assert jobs.systems("ddp", gp.SYSTEMS) is gp.SYSTEMS and jobs.ours("ddp", gp.OURS) is gp.OURS
    assert jobs.skipped("ddp", gp.SYSTEMS, []) == {}
    quick = _args(monkeypatch, "--quick")
    assert (quick.ranks, quick.steps, quick.hidden) == (2, 30, 64)


def test_hsdp_runs_sharded_lives_systems_and_skips_the_others_with_a_reason() -> None:
    assert jobs.systems("hsdp", gp.SYSTEMS) is sharded.SYSTEMS  # the same definitions, not a copy
    why = jobs.skipped("hsdp", gp.SYSTEMS, [])
    assert set(why) == {s.label for s in gp.SYSTEMS}  # every DDP system, each with one line
    assert all(w and "\n" not in w for w in why.values())
    assert set(jobs.skipped("hsdp", gp.SYSTEMS, ["torchrun"])) == {gp.TORCHRUN}  # only those --systems names
    ours = jobs.ours("hsdp", gp.OURS)
    assert ours == {s.label for s in sharded.SYSTEMS if s.family == "taskd"}
    assert not any(label.startswith(("torchrun", "torchft")) for label in ours)


def test_hsdp_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    quick = _args(monkeypatch, "--quick", "--job", "hsdp")
    assert quick.ranks == 4 and quick.job == "hsdp"
    with pytest.raises(SystemExit):
        _args(monkeypatch, "--job", "hsdp", "--ranks", "3")
    assert jobs.check("hsdp", 6) is None and jobs.check("hsdp", 2) and jobs.check("ddp", 2) is None
    a = jobs.hsdp_args(_args(monkeypatch, "--job", "hsdp", "--steps", "60"))
    assert (a.hidden, a.layers, a.batch) == (jobs.HSDP_HIDDEN, jobs.HSDP_LAYERS, jobs.HSDP_BATCH)
    torchft = next(s for s in sharded.SYSTEMS if s.family == "torchft")
    assert sharded.steps_of(torchft, a) == 60  # the same work as every other system, not sharded_live's 3 x


def test_hsdp_start_passes_restarts_and_hang_detection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(sharded, "Launch", lambda cmd, env, log: seen.append(cmd))
    args = _args(monkeypatch, "--job", "hsdp", "--heartbeat-timeout", "3", "--max-restarts", "50")
    for i, system in enumerate(sharded.SYSTEMS):
        jobs.start_hsdp(system, 4, args, tmp_path / str(i))
    for system, cmd in zip(sharded.SYSTEMS, seen, strict=True):
        assert cmd[cmd.index("--max-restarts") + 1] == "50"
        assert ("--heartbeat-timeout" in cmd) == (system.family == "taskd")
        assert cmd[cmd.index("--steps") + 1] == str(args.steps)


def test_hsdp_outcome_counts_redone_and_never_processed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank0.computed").write_text("".join(f"{s} 1.0 10\n" for s in [0, 1, 2, 3, 2, 3, 4, 5, 6, 7]))
    (out / "rank1.computed").write_text("".join(f"{s} 1.0 11\n" for s in [0, 1, 2, 3, 6, 7]))  # 4, 5 never
    args = argparse.Namespace(steps=8, batch=16)
    got = jobs.outcome("hsdp", args, tmp_path, 2)
    assert got == {"redone": {0: 2, 1: 0}, "samples_never_processed": 2 * 16, "replicas_agree": None}
    assert not jobs.finished("hsdp", tmp_path, 2)
    torchft = next(s for s in sharded.SYSTEMS if s.family == "torchft")
    assert jobs.identical("hsdp", torchft, tmp_path, tmp_path, 2) is None and torchft.label in jobs.NOT_COMPARED
    assert jobs.identical("hsdp", sharded.SYSTEMS[0], tmp_path, tmp_path, 2) is None  # no shards written


def test_never_processed_column() -> None:
    assert gp._never_processed(True) == "0" and gp._never_processed(False) == "?" and gp._never_processed(None) == "-"
    assert gp._never_processed(None, 32) == "32" and gp._never_processed(True, 0) == "0"


def test_replicas_agree_compares_the_same_shard_of_the_two_groups(tmp_path: Path) -> None:
    import torch

    assert jobs.replicas_agree(tmp_path, 4) is None  # no shards written
    for r, v in enumerate([1.0, 2.0, 1.0, 2.0]):  # ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1
        torch.save({"w": torch.full((2,), v)}, tmp_path / f"rank{r}.pt")
    assert jobs.replicas_agree(tmp_path, 4) is True
    torch.save({"w": torch.full((2,), 2.5)}, tmp_path / "rank3.pt")  # a group that trained alone
    assert jobs.replicas_agree(tmp_path, 4) is False
