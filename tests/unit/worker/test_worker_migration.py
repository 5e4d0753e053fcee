"""A rank's side of a planned migration (taskd.worker.migration): who leaves, and the one step boundary every rank
takes (the first to ask names the boundary after its next step; the others read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskd.worker.control_file import Control, LiveProtocolError, read_control, write_control
from taskd.worker.migration import BOUNDARY_KEY, boundary, leaving


class DictStore:
    """compare_set as TCPStore's: set `desired` when the key is absent and `expected` is "", return the value."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if key not in self.data and expected == "":
            self.data[key] = desired.encode()
        elif key in self.data and self.data[key] == expected.encode():
            self.data[key] = desired.encode()
        return self.data.get(key, expected.encode())


def test_the_first_rank_to_ask_names_the_boundary_after_its_next_step() -> None:
    store, control = DictStore(), Control(7, "migrate", extra={"leaving": [2]})
    assert boundary(store, control, 40) == 41  # rank A, about to run step 40: every rank can still stop before 41
    assert boundary(store, control, 41) == 41  # rank B, already at 41 when it first looked: the same boundary
    assert boundary(store, control, 40) == 41
    assert list(store.data) == [BOUNDARY_KEY.format(generation=7)]


def test_leaving_reads_only_rank_numbers() -> None:
    assert leaving(Control(3, "migrate", extra={"leaving": [2, 0]})) == {0, 2}
    assert leaving(Control(3, "migrate", extra={"leaving": [True, -1, "1", 3]})) == {3}
    assert leaving(Control(3, "migrate", extra={"leaving": 2})) == frozenset()
    assert leaving(Control(3, "rejoin")) == frozenset()


def test_migrate_and_release_keep_the_group_until_the_boundary(tmp_path: Path) -> None:
    path = tmp_path / "control"
    migrate = write_control(path, 5, "migrate", leaving=[1])
    assert read_control(path) == migrate._replace(time=read_control(path).time)  # type: ignore[union-attr]
    assert not migrate.ends(4)  # the leave watch does not break generation 4: the ranks leave at the boundary
    assert not write_control(path, 5, "release").ends(5)
    with pytest.raises(LiveProtocolError):
        write_control(path, 5, "move")
