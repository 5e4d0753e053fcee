"""RetiredGroups holds a left group until its work has timed out, and past exit whatever is still held."""

from __future__ import annotations

import sys
import weakref

from taskd.worker.torch_group import RetiredGroups, outlive_exit


class Group:
    """Stands for a process group: something weak-referenceable whose freeing we can watch."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_group_is_let_go_only_once_its_timeout_and_margin_have_passed() -> None:
    clock = Clock()
    retired = RetiredGroups(clock)
    group = Group()
    ref = weakref.ref(group)
    retired.hold(group, 30.0)
    del group
    clock.now += 34.0
    assert retired.release_expired() == 0 and ref() is not None  # within timeout + margin: still held
    clock.now += 2.0
    assert retired.release_expired() == 1
    assert ref() is None and len(retired) == 0


def test_holding_another_group_lets_go_of_the_expired_ones() -> None:
    clock = Clock()
    retired = RetiredGroups(clock)
    retired.hold(Group(), 1.0)
    clock.now += 10.0
    retired.hold(Group(), 1.0)
    assert len(retired) == 1


def test_groups_still_held_at_the_end_get_a_reference_no_one_gives_back() -> None:
    clock = Clock()
    retired = RetiredGroups(clock)
    old, recent = Group(), Group()
    retired.hold(old, 1.0)
    clock.now += 10.0
    retired.hold(recent, 60.0)
    refs = sys.getrefcount(recent)
    assert retired.keep_past_exit() == 1  # the expired one is simply let go
    assert sys.getrefcount(recent) == refs  # our list's reference became the extra, permanent one
    assert len(retired) == 0


def test_outlive_exit_gives_each_group_a_reference_no_one_gives_back() -> None:
    groups = [Group(), Group()]
    refs = [weakref.ref(g) for g in groups]
    assert outlive_exit(groups) == 2
    del groups
    assert all(ref() is not None for ref in refs)  # never freed, so never freed while the interpreter finalizes
