"""The one reader of snapshot folders (worker/snapshot_files.py): what a folder holds, read from its names."""

from __future__ import annotations

import re
from pathlib import Path

from taskd.agent.snapshots import copies
from taskd.worker import snapshot_files as files

TASKD = Path(__file__).resolve().parents[3] / "taskd"


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")


def test_a_folder_holds_the_steps_under_their_published_names_only(tmp_path: Path) -> None:
    rank = tmp_path / "rank3"
    _touch(rank, files.segment_name(7), files.segment_name(12), ".free-0-abc", ".in-13-0a1b2c",
           ".s13.99.0a1b2c3d.tmp", f"{files.segment_name(5)}.corrupt", "s7.snap", "notes")
    assert files.steps_in(str(rank)) == {7, 12}
    assert files.steps_in(str(rank), below=12) == {7}
    assert files.steps_in(str(rank), suffix=".corrupt") == {5}
    assert files.steps_in(str(tmp_path / "rank9")) == set()  # a missing folder holds nothing
    assert (files.step_of(files.segment_name(40)), files.step_of("s40.snap")) == (40, None)


def test_rank_folders_and_what_each_holds(tmp_path: Path) -> None:
    _touch(tmp_path / "rank0", files.segment_name(1), files.segment_name(2))
    _touch(tmp_path / "rank1", files.segment_name(2))
    _touch(tmp_path / ".persist", "rank0-" + files.segment_name(2))
    _touch(tmp_path, "rank0.restored")
    (tmp_path / "peer").mkdir()
    assert files.rank_folders(str(tmp_path)) == {0: str(tmp_path / "rank0"), 1: str(tmp_path / "rank1")}
    assert files.held(str(tmp_path)) == {0: {1, 2}, 1: {2}}
    assert copies.to_push(str(tmp_path)) == {0: 2, 1: 2}  # the agent's push reads the same


def test_no_other_module_reads_snapshot_names() -> None:
    """The rank's store, the persisted copies and the buddy's copies once had a listdir and a regex each: one
    reader now, so that they cannot drift apart on what a folder holds."""
    pattern = re.compile(r"\\\.snap|s\{step:012d\}|rank\(\\d\+\)")
    readers = sorted(str(p.relative_to(TASKD)) for p in TASKD.rglob("*.py")
                     if p.name != "snapshot_files.py" and pattern.search(p.read_text()))
    assert readers == []
