"""RetiredGroups holds a left group until its work has timed out, and past exit whatever is still held; at close,
the other threads get the GIL until none is runnable (settle_threads)."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import weakref

from taskd.worker.torch_group import RetiredGroups, outlive_exit, runnable_threads, settle_threads


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


class Looks:
    """A clock that moves by each sleep, and a scripted count of runnable threads at each look."""

    def __init__(self, counts: list[int]) -> None:
        self.now = 0.0
        self.counts = counts
        self.looks = 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def runnable(self) -> int:
        self.looks += 1
        return self.counts.pop(0) if self.counts else 0


def test_settle_waits_for_two_quiet_looks_in_a_row() -> None:
    looks = Looks([1, 0, 1, 0, 0, 1])
    assert settle_threads(2.0, 0.02, runnable=looks.runnable, clock=lambda: looks.now, sleep=looks.sleep)
    assert looks.looks == 5  # a quiet look then a runnable one starts the count over


def test_settle_gives_up_at_its_limit_when_a_thread_stays_runnable() -> None:
    looks = Looks([1] * 1000)
    assert not settle_threads(1.0, 0.02, runnable=looks.runnable, clock=lambda: looks.now, sleep=looks.sleep)
    assert 0.98 <= looks.now <= 1.02


def test_a_spinning_thread_is_runnable_and_a_waiting_one_is_not() -> None:
    """The real /proc look: a thread computing counts, one blocked on an event does not, nor one whose name is
    left out (as gloo's I/O loop is: it never takes the GIL)."""
    stop, waiting, named = threading.Event(), threading.Event(), threading.Event()

    def spin() -> None:
        ctypes.CDLL(None).prctl(15, b"spin-test", 0, 0, 0)  # PR_SET_NAME: the name /proc shows
        named.set()
        while not stop.is_set():
            sum(range(1000))

    blocked = threading.Thread(target=waiting.wait, daemon=True)
    blocked.start()
    quiet = []
    for _ in range(5):
        time.sleep(0.01)  # long enough for the new thread to reach its wait
        quiet.append(runnable_threads())
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        assert named.wait(5)
        busy = [runnable_threads() for _ in range(20)]
        left_out = [runnable_threads(frozenset({"spin-test"})) for _ in range(20)]
    finally:
        stop.set()
        waiting.set()
        spinner.join(5)
        blocked.join(5)
    assert min(quiet) == 0, quiet  # the blocked thread (and pytest's own) are asleep
    assert max(busy) >= 1, busy  # the spinner wants the GIL the looking thread holds between looks: runnable
    assert max(left_out) == 0, left_out


def test_settle_at_exit_registers_settle_threads_once(monkeypatch) -> None:
    from taskd.worker import torch_group

    registered: list[object] = []
    monkeypatch.setattr(torch_group, "_settle_registered", False)
    monkeypatch.setattr(torch_group.atexit, "register", registered.append)
    torch_group.settle_at_exit()
    torch_group.settle_at_exit()  # a second LiveGroup in the same process
    assert registered == [settle_threads]
