"""A rank's compute time in its heartbeat file (bytes 232-247): the time between heartbeats less its waits
on peers (`taskd.worker.collective()`, LiveGroup's marks). Driven on a fake monotonic clock."""

from __future__ import annotations

import pytest

from taskd.worker import heartbeat_file as hbf
from taskd.worker import progress


@pytest.fixture
def clock(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    path = tmp_path / "rank_0.hb"
    hbf.HeartbeatFile(path).create()
    monkeypatch.setenv("TASKD_HEARTBEAT_FILE", str(path))
    monkeypatch.setattr(progress, "_beacon", None)
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    yield now, hbf.HeartbeatFile(path)
    if isinstance(progress._beacon, progress._Beacon):
        progress._beacon.file.close()


def test_compute_is_the_time_between_heartbeats_outside_collectives(clock) -> None:  # noqa: ANN001
    now, reader = clock
    progress.heartbeat(0)  # the first heartbeat starts the count: no interval yet
    assert (reader.read().compute, reader.read().compute_intervals) == (0.0, 0)
    now[0] += 0.3
    with progress.collective():
        now[0] += 0.5  # waiting on the others
    now[0] += 0.2
    progress.heartbeat(1)
    state = reader.read()
    assert state.compute == pytest.approx(0.5) and state.compute_intervals == 1
    with progress.collective():  # a wait still open at the heartbeat: its part before it is left out
        now[0] += 1.0
        progress.heartbeat(2)
        now[0] += 0.25
    now[0] += 0.1
    progress.heartbeat(3)
    state = reader.read()
    assert state.compute == pytest.approx(0.6) and state.compute_intervals == 3


def test_nested_marks_count_once_and_a_recovery_is_nobodys_compute(clock) -> None:  # noqa: ANN001
    now, reader = clock
    progress.heartbeat(0)
    progress.mark_wait(True)
    progress.mark_wait(True)
    now[0] += 0.4
    progress.mark_wait(False)
    now[0] += 0.4
    progress.mark_wait(False)
    now[0] += 0.1
    progress.heartbeat(1)
    assert reader.read().compute == pytest.approx(0.1)
    now[0] += 30.0  # the group was rebuilt: LiveRank.joined() forgets the interval
    progress.forget_interval()
    progress.heartbeat(2)
    now[0] += 0.2
    progress.heartbeat(3)
    state = reader.read()
    assert state.compute == pytest.approx(0.3) and state.compute_intervals == 2


def test_outside_taskd_the_marker_does_nothing(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("TASKD_HEARTBEAT_FILE", raising=False)
    monkeypatch.delenv("TASKD_HEARTBEAT_DIR", raising=False)
    monkeypatch.setattr(progress, "_beacon", None)
    with progress.collective():
        pass
    progress.mark_wait(True)
    progress.forget_interval()
    assert progress._beacon is progress._DISABLED
