"""StuckWatch: a rank left blocked in its broken group's collective ends itself; one still computing does not.

The process's CPU time is the watch's signal: the test process is otherwise idle while a thread waits."""

from __future__ import annotations

import threading
import time

import pytest
from support import wait_for

from taskd.worker.torch_stuck import StuckWatch

AFTER, POLL = 0.4, 0.05


class Mark:
    def __init__(self) -> None:
        self.in_flight = True
        self.epoch = 0


def watch(mark: Mark, fired: list[float]) -> StuckWatch:
    return StuckWatch(mark, fired.append, time.process_time, after=AFTER, poll=POLL)


def training_thread(busy: bool, stop: threading.Event) -> threading.Thread:
    """A thread that waits without CPU (as gloo's lost receive does) or computes, until ``stop``."""
    started = threading.Event()

    def run() -> None:
        started.set()
        while not stop.is_set():
            if busy:
                sum(i * i for i in range(20_000))  # a backward still computing
            else:
                stop.wait()  # a condition variable wait: no CPU
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(5)
    return thread


def test_a_training_thread_blocked_without_cpu_inside_its_collective_is_ended():
    stop = threading.Event()
    training_thread(busy=False, stop=stop)
    fired: list[float] = []
    try:
        started = time.monotonic()
        w = watch(Mark(), fired)
        w.arm()
        w.arm()  # armed again by a second word of the agent: still one watcher
        wait_for(lambda: fired, AFTER * 10, "the blocked thread judged stuck")
        assert AFTER <= fired[0] <= time.monotonic() - started
        time.sleep(3 * POLL)
        assert len(fired) == 1
    finally:
        stop.set()


def test_a_training_thread_still_computing_is_left_alone():
    stop = threading.Event()
    training_thread(busy=True, stop=stop)
    fired: list[float] = []
    try:
        watch(Mark(), fired).arm()
        time.sleep(AFTER * 4)
        assert fired == [], "a thread using CPU was taken for a blocked one"
    finally:
        stop.set()


@pytest.mark.parametrize("moved_on", ["collective ended", "mark cleared"])
def test_a_rank_that_got_out_of_the_collective_is_not_watched_further(moved_on):
    stop = threading.Event()
    training_thread(busy=False, stop=stop)
    fired: list[float] = []
    mark = Mark()
    try:
        w = watch(mark, fired)
        w.arm()
        time.sleep(AFTER / 2)
        if moved_on == "collective ended":
            mark.in_flight = False
        else:
            mark.epoch += 1  # it left (and may already be in the next generation's collective)
            time.sleep(2 * POLL)
            mark.in_flight = True
        time.sleep(AFTER * 2)
        assert fired == []
    finally:
        stop.set()


def test_a_new_collective_is_watched_even_while_the_old_watcher_still_runs():
    """Left and rejoined within a poll, then told to leave again: the new collective gets a watcher of its own."""
    stop = threading.Event()
    training_thread(busy=False, stop=stop)
    fired: list[float] = []
    mark = Mark()
    try:
        w = watch(mark, fired)
        w.arm()
        mark.epoch += 1  # the old watcher returns at its next poll
        w.arm()
        wait_for(lambda: fired, AFTER * 10, "the new collective's watcher to fire")
    finally:
        stop.set()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="positive"):
        StuckWatch(Mark(), print, after=0)
