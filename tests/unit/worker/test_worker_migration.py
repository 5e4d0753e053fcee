"""A rank's side of a planned migration (taskd.worker.migration): who leaves, and the one step boundary every rank
takes (once every rank has seen the request, the one that completes the count names the boundary after its next
step; the others read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskd.worker.control_file import Control, LiveProtocolError, read_control, write_control
from taskd.worker.migration import BOUNDARY_KEY, SEEN_KEY, boundary, is_node_move, leaving


class DictStore:
    """compare_set as TCPStore's: set `desired` when the key is absent and `expected` is "", return the value."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def add(self, key: str, amount: int) -> int:
        self.data[key] = str(int(self.data.get(key, b"0")) + amount).encode()
        return int(self.data[key])

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if key not in self.data and expected == "":
            self.data[key] = desired.encode()
        elif key in self.data and self.data[key] == expected.encode():
            self.data[key] = desired.encode()
        return self.data.get(key, expected.encode())


def test_once_every_rank_has_seen_it_the_boundary_is_after_the_next_step() -> None:
    store, control = DictStore(), Control(7, "migrate", extra={"leaving": [2]})
    assert boundary(store, control, 40, 2, counted=False) is None  # rank A, about to run step 40: B has not seen it
    assert boundary(store, control, 40, 2, counted=False) == 41  # rank B, the last to see it: every rank stops at 41
    assert boundary(store, control, 41, 2, counted=True) == 41  # rank A, at 41: the same boundary, counted once
    assert sorted(store.data) == sorted([SEEN_KEY.format(generation=7), BOUNDARY_KEY.format(generation=7)])


def test_a_rank_whose_request_came_late_is_waited_for() -> None:
    """Across nodes: B's node's control file came a step late. A keeps training until B has seen it too, so no rank
    passes a boundary B never heard of (B would block in a step its peers left)."""
    store, control = DictStore(), Control(7, "migrate", extra={"leaving": [2], "node": True})
    assert boundary(store, control, 40, 2, counted=False) is None  # A sees it before step 40
    assert boundary(store, control, 41, 2, counted=True) is None  # and before 41: B still has not
    assert boundary(store, control, 41, 2, counted=False) == 42  # B sees it before 41 (A is inside step 41)
    assert boundary(store, control, 42, 2, counted=True) == 42  # both leave at 42
    assert is_node_move(control) and not is_node_move(Control(7, "migrate", extra={"node": 1}))


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


def test_only_a_join_a_node_migration_named_counts_itself_in() -> None:
    """A join of any other generation (first start, recovery, a one-rank migration) makes no store round trip."""
    from torch.distributed import HashStore

    from taskd.worker.migration import JOINED_KEY, count_joined

    store = HashStore()
    node_move = Control(7, "migrate", extra={"leaving": [2, 3], "node": True})
    for control in (None, Control(7, "rejoin"), Control(7, "migrate", extra={"leaving": [2]}), node_move):
        assert not count_joined(store, control, 8)  # joined 8: the request named another generation
    for control in (None, Control(7, "rejoin"), Control(7, "retry"), Control(7, "migrate", extra={"leaving": [2]}),
                    Control(7, "rejoin", extra={"node": True})):
        assert not count_joined(store, control, 7)
    assert store.num_keys() == 0  # not one call reached the store
    assert count_joined(store, node_move, 7) and count_joined(store, node_move, 7)
    assert store.num_keys() == 1 and store.add(JOINED_KEY.format(generation=7), 0) == 2
