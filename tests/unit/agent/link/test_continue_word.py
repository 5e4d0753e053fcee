"""The agent's half of the continue handshake (issue 31): asked of the controller, answered or fenced."""

from __future__ import annotations

import time
from pathlib import Path

from taskd.agent.link.registration import ContinueWord
from taskd.proto import recover_pb2
from taskd.vocabulary import Code
from taskd.worker.heartbeat_file import CONTINUE, OFF_CONTINUE, HeartbeatFile


class Client:
    """The RecoverClient's HealthCheck, answering what the test says (the real one is exercised end to end in
    tests/e2e/agent/test_fenced_after_end.py)."""

    def __init__(self, code: int, info: str = "") -> None:
        self.status = recover_pb2.Status(code=code, info=info)
        self.calls: list[float] = []

    def health_check(self) -> recover_pb2.Status:
        self.calls.append(time.monotonic())
        return self.status


def asking(tmp_path: Path, name: str, at: float) -> HeartbeatFile:
    hb = HeartbeatFile(tmp_path / name).create()
    CONTINUE.pack_into(hb.buffer, OFF_CONTINUE, -at)  # what the rank's SIGCONT handler writes
    return hb


def settle(word: ContinueWord) -> None:
    if word._asking is not None:
        word._asking.join(5)


def test_the_holder_answers_every_rank_that_asked_with_the_time_it_asked_the_controller(tmp_path: Path) -> None:
    at = time.monotonic()
    files = [asking(tmp_path, f"rank_{r}.hb", at) for r in range(2)]
    quiet = HeartbeatFile(tmp_path / "rank_2.hb").create()
    client, fenced = Client(Code.OK), []
    word = ContinueWord(lambda: client, fenced.append)
    word.watch([*files, quiet, None], time.monotonic())
    settle(word)
    assert len(client.calls) == 1 and fenced == []
    for f in files:
        answer = CONTINUE.unpack_from(f.buffer, OFF_CONTINUE)[0]
        assert at <= answer <= client.calls[0] and f.continue_asked() is None
    assert CONTINUE.unpack_from(quiet.buffer, OFF_CONTINUE)[0] == 0.0  # not asked, not answered
    word.watch(files, time.monotonic() + 1)
    settle(word)
    assert len(client.calls) == 1  # nothing asked since: no question to the controller


def test_a_fenced_agent_gives_no_word_and_fences_itself(tmp_path: Path) -> None:
    hb = asking(tmp_path, "rank_0.hb", time.monotonic())
    client, fenced = Client(Code.FENCED, "node 1 of job j ... is now held by h2:201"), []
    word = ContinueWord(lambda: client, fenced.append)
    word.watch([hb], time.monotonic())
    settle(word)
    assert fenced == ["node 1 of job j ... is now held by h2:201"] and hb.continue_asked() is not None


def test_without_a_controller_the_word_is_given_at_once(tmp_path: Path) -> None:
    at = time.monotonic()
    hb = asking(tmp_path, "rank_0.hb", at)
    word = ContinueWord(lambda: None, lambda _why: None)
    word.watch([hb], time.monotonic())
    assert hb.continue_asked() is None and CONTINUE.unpack_from(hb.buffer, OFF_CONTINUE)[0] >= at


def test_an_unreachable_controller_is_asked_again_not_answered_for(tmp_path: Path) -> None:
    hb = asking(tmp_path, "rank_0.hb", time.monotonic())

    class Down(Client):
        def health_check(self) -> recover_pb2.Status:
            self.calls.append(time.monotonic())
            raise ConnectionError("unreachable")

    client = Down(Code.OK)
    word = ContinueWord(lambda: client, lambda _why: None)
    now = time.monotonic()
    word.watch([hb], now)
    settle(word)
    word.watch([hb], now + 0.1)  # within RETRY: not asked again yet
    settle(word)
    assert len(client.calls) == 1 and hb.continue_asked() is not None
    word.watch([hb], now + 1.0)
    settle(word)
    assert len(client.calls) == 2
