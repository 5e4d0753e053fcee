"""StuckWatch: a rank left blocked in its broken group's collective ends itself; one still computing does not.

The watcher runs on its own thread as in a rank, but in simulated time (`Scene`: its clock, its sleep and the
process's CPU seconds), so the production settings (5 s, polled every 0.25 s) play out in microseconds and the
judgement is exact. tests/e2e/worker/test_live_ring.py sees a real rank blocked in gloo end itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from support import wait_for

from taskd.worker import torch_stuck
from taskd.worker.torch_stuck import StuckWatch

AFTER = torch_stuck.STUCK_AFTER
SAFETY = 1000.0  # simulated seconds: a watcher still running then is let go (the mark is cleared) and the test fails


class Mark:
    def __init__(self) -> None:
        self.in_flight = True
        self.epoch = 0


class Scene:
    """A rank's life in simulated time: each of the watcher's sleeps moves the clock, adds the CPU the process
    used meanwhile (`busy`: its share of one CPU), then carries out what was scheduled by then (`at`). While
    `gate` is clear the watcher's sleep waits for it (a watcher caught in the middle of its poll)."""

    def __init__(self, busy: float = 0.0) -> None:
        self.mark = Mark()
        self.busy = busy
        self.now = 0.0
        self.cpu_seconds = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()
        self._due: list[tuple[float, Callable[[], None]]] = [(SAFETY, self.leave)]

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._due.append((when, action))

    def leave(self) -> None:
        self.mark.in_flight = False

    def clock(self) -> float:
        with self._lock:
            return self.now

    def cpu(self) -> float:
        with self._lock:
            return self.cpu_seconds

    def sleep(self, seconds: float) -> None:
        assert self.gate.wait(10), "the test never opened the gate"
        with self._lock:
            self.now += seconds
            self.cpu_seconds += self.busy * seconds
            due = [action for when, action in self._due if when <= self.now]
            self._due = [(when, action) for when, action in self._due if when > self.now]
        for action in due:
            action()

    def watch(self, fired: list[float]) -> StuckWatch:
        """A watch with the production settings, living in this scene."""
        return StuckWatch(self.mark, fired.append, self.cpu, clock=self.clock, sleep=self.sleep)


def ended(w: StuckWatch) -> None:
    wait_for(lambda: not w.watching, 10, "the watcher to end")


def watchers() -> set[threading.Thread]:
    """The watcher threads alive now (by identity: one a previous test left may end at any moment)."""
    return {t for t in threading.enumerate() if t.name == "taskd-stuck-watch" and t.is_alive()}


def test_a_rank_blocked_without_cpu_inside_its_collective_is_ended_after_the_setting() -> None:
    scene, fired = Scene(), []
    w = scene.watch(fired)
    scene.gate.clear()  # the first watcher is inside its first poll when the second word arrives
    before = watchers()
    w.arm()
    w.arm()  # armed again by a second word of the agent: still one watcher
    assert len(watchers() - before) == 1
    scene.gate.set()
    ended(w)
    assert fired == [AFTER] and scene.now == AFTER  # on the first poll past the setting, and once


@pytest.mark.parametrize(("share", "stuck"), [(0.05, True), (0.5, False), (1.0, False)])
def test_a_process_using_a_tenth_of_a_cpu_or_more_is_computing_not_blocked(share: float, stuck: bool) -> None:
    """Under a tenth of one CPU over a poll the process is waiting (a stray thread's tick); more is a backward
    still computing, on the training thread or on autograd's device thread."""
    scene, fired = Scene(busy=share), []
    scene.at(4 * AFTER, scene.leave)  # the backward ends, the rank leaves the collective
    w = scene.watch(fired)
    w.arm()
    ended(w)
    assert fired == ([AFTER] if stuck else [])


def test_the_wait_counts_from_when_the_process_stopped_computing_and_reports_the_whole_time() -> None:
    scene, fired = Scene(busy=1.0), []
    scene.at(3.0, lambda: setattr(scene, "busy", 0.0))  # computed for 3 s, then blocked
    w = scene.watch(fired)
    w.arm()
    ended(w)
    assert fired == [3.0 + AFTER]  # seconds since it was armed, as the rank's last log line says


@pytest.mark.parametrize("moved_on", ["collective ended", "mark cleared"])
def test_a_rank_that_got_out_of_the_collective_is_not_watched_further(moved_on: str) -> None:
    scene, fired = Scene(), []
    if moved_on == "collective ended":
        scene.at(AFTER / 2, scene.leave)
    else:  # it left, and is already in the next generation's collective
        scene.at(AFTER / 2, lambda: setattr(scene.mark, "epoch", 1))
    w = scene.watch(fired)
    w.arm()
    ended(w)
    assert fired == [] and scene.now == AFTER / 2  # it stopped at the first poll that saw it


def test_a_new_collective_is_watched_even_while_the_old_watcher_still_runs() -> None:
    """Left and rejoined within a poll, then told to leave again: the new collective gets a watcher of its own."""
    scene, fired = Scene(), []
    w = scene.watch(fired)
    scene.gate.clear()
    before = watchers()
    w.arm()
    scene.mark.epoch += 1  # the old watcher returns at its next poll
    w.arm()
    mine = watchers() - before
    assert len(mine) == 2
    scene.gate.set()
    ended(w)
    wait_for(lambda: not any(t.is_alive() for t in mine), 10, "the old watcher to end too")
    assert len(fired) == 1 and AFTER <= fired[0] < SAFETY


def test_the_default_cpu_clock_counts_every_thread_of_the_process() -> None:
    """The watch's premise: a backward computing on another thread (autograd's) moves `time.process_time`."""
    def compute() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.05:
            sum(i * i for i in range(1000))

    main_cpu, process_cpu = time.thread_time(), time.process_time()
    worker = threading.Thread(target=compute)
    worker.start()
    worker.join(10)
    assert not worker.is_alive()
    assert time.process_time() - process_cpu >= 0.05 > time.thread_time() - main_cpu


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        StuckWatch(Mark(), print, after=0)
