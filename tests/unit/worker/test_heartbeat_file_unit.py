"""The tests of tests/e2e/worker/test_heartbeat_file.py that start no process and open no network
socket (the unit tier).

Split from it by move_tests.py; its subject: HeartbeatFile.read() when a rank died in the middle of
a write (odd sequence counter).
"""

from __future__ import annotations

import time

from support.worker import seq_of

from taskd.worker import heartbeat_file as hbf
from taskd.worker.heartbeat_file import HeartbeatFile


def write_beat(hb: HeartbeatFile, seq: int, when: float, step: int, pid: int, beats: int) -> None:
    """What the rank's writer does, optionally stopped half-way (odd `seq`, fields already new)."""
    buf = hb.buffer
    hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, seq | 1)
    hbf.IDENT.pack_into(buf, hbf.OFF_IDENT, pid, 0)
    hbf.BEAT.pack_into(buf, hbf.OFF_BEAT, when, step)
    hbf.COUNT.pack_into(buf, hbf.OFF_COUNT, beats)
    if seq % 2 == 0:
        hbf.SEQ.pack_into(buf, hbf.OFF_SEQ, seq)


def test_odd_sequence_is_reported_torn_with_the_last_consistent_fields(tmp_path):
    path = tmp_path / "rank_0.hb"
    reader = HeartbeatFile(path).create().open()
    writer = HeartbeatFile(path).open()
    old = time.time() - 100.0
    write_beat(writer, seq=2, when=old, step=5, pid=4242, beats=1)
    good = reader.read()
    assert not good.torn and (good.step, good.pid, good.time) == (5, 4242, old)

    # the rank dies half-way through its next beat: counter odd, time and step already new
    write_beat(writer, seq=3, when=time.time(), step=6, pid=4242, beats=2)
    number = reader.request_save()
    torn = reader.read()
    assert torn.torn
    # the half-written beat is not taken for a fresh one: the last consistent fields stand
    assert (torn.time, torn.step, torn.beats, torn.pid) == (old, 5, 1, 4242)
    assert torn.deadline(30.0) == old + 30.0 < time.time()  # so the agent's hang check still fires
    assert torn.save_request == number  # the agent's own field is current
    assert reader.read().torn  # stays torn: nothing will finish that write

    # a reader that never saw a consistent copy knows nothing: no heartbeat, no pid, no hang check
    fresh = HeartbeatFile(path).read()
    assert fresh.torn and fresh.time == 0.0 and fresh.step is None and fresh.pid == 0
    assert not fresh.started and fresh.deadline(30.0) is None

    # the next incarnation's create() resets the counter; reads are consistent again
    HeartbeatFile(path).create()
    again = reader.read()
    assert not again.torn and again.time == 0.0 and seq_of(path) == 0
    writer.close()
    reader.close()


def test_retries_are_bounded_even_with_retries_zero(tmp_path):
    path = tmp_path / "rank_0.hb"
    hb = HeartbeatFile(path).create().open()
    hbf.SEQ.pack_into(hb.buffer, hbf.OFF_SEQ, 1)
    assert hb.read(retries=0).torn
    assert hb.read(retries=1).torn
    hb.close()
