"""taskd.process: the one pidfd selector loop (exits, pipes, wake-ups) with real processes, and its layering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from taskd.process import EXIT_KIND, ExitSelector, RankWatch, exit_code_of

WAIT = 30.0


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


def select_until(sel: ExitSelector, key: str) -> list:
    """Events until ``key``'s exit is among them (a readable pipe stays readable: it repeats)."""
    events: list = []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        events += sel.select(WAIT)
        if any(e.key == key and e.kind == EXIT_KIND for e in events):
            break
    return events


def test_exit_is_reported_once_with_its_status_and_the_child_stays_unreaped():
    sel = ExitSelector()
    proc = sleeper()
    try:
        assert sel.watch("a", proc.pid)
        assert sel.select(0) == []
        proc.send_signal(signal.SIGKILL)
        [event] = select_until(sel, "a")
        assert (event.key, event.kind, event.returncode) == ("a", EXIT_KIND, -signal.SIGKILL)
        assert sel.watched() == []
        assert proc.wait(WAIT) == -signal.SIGKILL  # the peek did not reap it: its owner still can
        assert exit_code_of(proc.returncode) == 137
    finally:
        sel.close()
        sel.close()  # idempotent


def test_readers_and_exits_share_one_loop_and_wake_interrupts_it():
    sel = ExitSelector()
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    try:
        sel.add_reader("pipe", read_fd)
        sel.watch("rank", proc.pid)
        os.write(write_fd, b"x")
        events = select_until(sel, "rank")
        assert {(e.key, e.kind) for e in events} >= {("pipe", "read"), ("rank", EXIT_KIND)}
        assert [e.returncode for e in events if e.key == "rank"] == [3]
        sel.remove_reader("pipe")
        threading.Timer(0.05, sel.wake).start()
        assert sel.select(WAIT) == []  # woken, nothing to report
        proc.wait(WAIT)
    finally:
        sel.close()
        os.close(read_fd)
        os.close(write_fd)


def test_rank_watch_is_the_agents_view_of_the_same_loop():
    watch = RankWatch()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(4)"])
    try:
        assert watch.watch(1, proc.pid)
        exits = []
        for _ in range(100):
            exits += watch.wait(WAIT)
            if exits:
                break
        assert [(e.local_rank, e.pid, e.returncode) for e in exits] == [(1, proc.pid, 4)]
        proc.wait(WAIT)
        assert not watch.watch(2, proc.pid)  # reaped: gone
    finally:
        watch.close()


