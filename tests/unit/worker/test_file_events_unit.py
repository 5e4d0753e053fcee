"""FileReplaced: the leave watch sleeps in inotify until the agent replaces the control file, instead of a `stat`
every 5 ms (issue 20 item 4: at 8 ranks on 2 cores that polling took 10-18 % of each rank's CPU). Real inotify."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from taskd.worker.file_events import FileReplaced
from taskd.worker.live import write_control

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def test_a_replaced_control_file_wakes_the_waiter_at_once(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    events = FileReplaced.open(str(control))
    assert events is not None
    try:
        assert events.wait(0.05) is False  # nothing happened: the timeout
        timer = threading.Timer(0.2, write_control, (control, 1, "leave"))
        t0 = time.monotonic()
        timer.start()
        assert events.wait(10) is True
        assert 0.15 < time.monotonic() - t0 < 5  # woken by the rename, not by the timeout
        timer.join()
    finally:
        events.close()


def test_a_neighbours_event_does_not_end_the_wait_early(tmp_path: Path) -> None:
    """write_control closes a temporary file in the directory before it renames it into place: that first event
    names another file, and the wait goes on to the rename (it once returned False there, before its timeout)."""
    control = tmp_path / "control.json"
    events = FileReplaced.open(str(control))
    assert events is not None
    try:
        neighbour = threading.Timer(0.05, write_control, (tmp_path / "other.json", 1, "leave"))
        timer = threading.Timer(0.3, write_control, (control, 1, "leave"))
        t0 = time.monotonic()
        neighbour.start()
        timer.start()
        assert events.wait(10) is True
        assert 0.25 < time.monotonic() - t0 < 5
        neighbour.join()
        timer.join()
    finally:
        events.close()


def test_other_files_in_the_directory_do_not_wake_it_but_a_rewrite_in_place_does(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    events = FileReplaced.open(str(control))
    assert events is not None
    try:
        write_control(tmp_path / "other.json", 1, "leave")  # a neighbour renamed into the directory
        (tmp_path / "rank0.heartbeat").write_bytes(b"x")  # a neighbour written in place
        assert events.wait(0.2) is False
        control.write_text("{}")  # written in place (closed after writing), not renamed: still the file
        assert events.wait(5) is True
        assert events.wait(0.05) is False  # every queued event was read
    finally:
        events.close()


def test_a_missing_directory_gives_none_so_the_caller_polls(tmp_path: Path) -> None:
    assert FileReplaced.open(str(tmp_path / "gone" / "control.json")) is None


def _looks(path: Path, seconds: float, idle: float = 0.1, enough: int | None = None) -> int:
    """How many times a real LeaveWatch on ``path`` looks at the control file in ``seconds`` (or until it has
    looked ``enough`` times)."""
    from taskd.worker.torch_group import GroupSockets, LeaveWatch  # standard library only, like FileReplaced

    watch = LeaveWatch(str(path), GroupSockets(), interval=0.005, idle=idle)
    checks: list[float] = []
    check = watch._check
    watch._check = lambda: (checks.append(time.monotonic()), check())[1]  # type: ignore[method-assign]
    watch.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (enough is None or len(checks) < enough):
        time.sleep(0.01)
    watch.stop()
    return len(checks)


def test_the_leave_watch_looks_only_when_woken_or_idle(tmp_path: Path) -> None:
    looks = _looks(tmp_path / "control.json", 0.5)
    assert 2 <= looks <= 8, f"{looks} looks in 0.5 s: it polls (every 5 ms would be ~100)"


def test_a_broken_inotify_watch_leaves_the_leave_watch_polling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: FileReplaced, timeout: float) -> bool:
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(FileReplaced, "wait", broken)
    # idle 60 s: a watch that died with its inotify looks once or twice at most, one that polls every 5 ms
    # reaches 11 looks within the 10 s however loaded the machine (at load 41 it took over 0.3 s)
    looks = _looks(tmp_path / "control.json", 10.0, idle=60.0, enough=11)
    assert looks > 10, f"{looks} looks in 10 s: the watch died with its inotify instead of polling"
