"""The rank's half of the continue handshake (issue 31): after SIGCONT, no step before the agent's word."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from taskd.worker import continued
from taskd.worker.heartbeat_file import HeartbeatFile


def test_a_continued_rank_asks_and_waits_for_an_answer_given_after_it_asked(tmp_path: Path) -> None:
    hb = HeartbeatFile(tmp_path / "rank_0.hb").create()
    buf = HeartbeatFile(hb.path).buffer  # the rank's own mapping of the same file
    assert hb.continue_asked() is None  # never asked
    hb.answer_continue(5.0)  # an answer to an earlier stop does not cover this one
    held: list[float] = []
    result: list[bool] = []
    asked_at = time.monotonic()
    waiter = threading.Thread(target=lambda: result.append(continued.wait_for_word(buf, asked_at, held.append, 10.0)))
    waiter.start()
    deadline = time.monotonic() + 5
    while hb.continue_asked() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert hb.continue_asked() == asked_at  # the rank asked for this stop
    time.sleep(0.05)
    assert waiter.is_alive() and held, "the rank must wait, holding its background saves"
    hb.answer_continue(asked_at + 0.001)  # the agent asked the controller after the rank asked
    waiter.join(5)
    assert result == [True] and hb.continue_asked() is None
    hb.close()


def test_without_an_answer_the_rank_goes_on_after_its_limit(tmp_path: Path) -> None:
    hb = HeartbeatFile(tmp_path / "rank_0.hb").create()
    now = [100.0]

    def clock() -> float:
        now[0] += 0.5
        return now[0]

    assert continued.wait_for_word(hb.buffer, 100.0, lambda _s: None, limit=2.0, clock=clock) is False
    assert hb.continue_asked() == 100.0  # still asking: a late answer is harmless
    hb.close()
