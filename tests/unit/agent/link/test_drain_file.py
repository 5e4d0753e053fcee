"""The drain hook's file (`taskd run --drain-file PATH`, agent/link/drain.py): checked where the config is built, one
request per appearance (the file is taken: removed), looked for at most every LOOK_EVERY s, a file left from before
the agent started removed unread, a drain while this agent holds no node ignored. The request itself (a real
`JobControl/Migrate`) is tests/e2e/agent/test_migrate_node.py's."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from taskd.agent.config import AgentConfig
from taskd.agent.link.drain import LOOK_EVERY, Drain, check_drain_file


class Asked(Drain):
    """Records the requests it would send instead of calling the controller (no socket in unit tests)."""

    def __init__(self, file: str | None, client: object = SimpleNamespace(info=SimpleNamespace(standby=False))) -> None:
        super().__init__(SimpleNamespace(client=client), file)
        self.asked: list[int] = []

    def _ask(self, mgr: object, node_rank: int) -> None:
        self.asked.append(node_rank)
        self._thread = None


@pytest.fixture(autouse=True)
def no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_ask` runs on the caller's thread here: the request is recorded before `poll` returns."""
    class Inline:
        def __init__(self, target, args, **_: object) -> None:  # type: ignore[no-untyped-def]
            self.target, self.args = target, args

        def start(self) -> None:
            self.target(*self.args)

    monkeypatch.setattr("taskd.agent.link.drain.threading.Thread", Inline)


def test_each_appearance_is_one_request_and_the_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "drain"
    drain = Asked(str(path))
    drain.poll(1, 10.0)
    assert drain.asked == []
    path.touch()
    drain.poll(1, 10.1)  # within LOOK_EVERY of the last look: not looked for yet
    assert drain.asked == [] and path.exists()
    drain.poll(1, 10.0 + LOOK_EVERY)
    assert drain.asked == [1] and not path.exists()
    drain.poll(1, 20.0)
    assert drain.asked == [1]  # gone: no second request
    path.touch()
    drain.poll(1, 30.0)
    assert drain.asked == [1, 1] and not path.exists()


def test_a_file_there_before_the_agent_started_is_removed_unread(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "drain"
    path.touch()
    with caplog.at_level(logging.WARNING, "taskd.agent"):
        drain = Asked(str(path))
    assert not path.exists() and "was there before this agent started" in caplog.text
    drain.poll(1, 1.0)
    assert drain.asked == []


def test_no_node_or_no_controller_takes_the_file_and_asks_nothing(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "drain"
    standby, alone = Asked(str(path)), Asked(str(path), client=None)
    # a standby that yielded a node to another agent keeps that node's layout, but is registered as a standby
    yielded = Asked(str(path), client=SimpleNamespace(info=SimpleNamespace(standby=True)))
    with caplog.at_level(logging.WARNING, "taskd.agent"):
        path.touch()
        standby.poll(None, 1.0)
        path.touch()
        alone.poll(0, 1.0)
        path.touch()
        yielded.poll(1, 1.0)
    assert standby.asked == alone.asked == yielded.asked == [] and not path.exists()
    assert f"drain (file {path}) ignored: this agent holds no node" in caplog.text
    assert f"drain (file {path}) ignored: no controller to ask" in caplog.text


def test_the_signal_still_asks_and_no_file_is_needed(tmp_path: Path) -> None:
    drain = Asked(None)
    assert drain.signalled(10) and not drain.signalled(15)
    drain.poll(2, 0.0)
    assert drain.asked == [2]
    drain.poll(2, 1.0)
    assert drain.asked == [2]


def test_a_file_that_cannot_be_removed_is_acted_on_once_then_no_longer_watched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "drain"
    drain = Asked(str(path))
    path.mkdir()  # unlink() refuses a directory, as it would a file in a directory made read-only since
    with caplog.at_level(logging.ERROR, "taskd.agent"):
        drain.poll(1, 1.0)
        drain.poll(1, 2.0)
    assert drain.asked == [1] and drain.file is None and "cannot be removed" in caplog.text


@pytest.mark.parametrize("make,needle", [
    (lambda d: str(d), "is a directory: give the path of a file in it"),
    (lambda d: str(d / "missing" / "drain"), "/missing does not exist (or is not a directory): create it first"),
    (lambda d: (d / "f").touch() or str(d / "f" / "drain"), "/f does not exist (or is not a directory)"),
    (lambda d: " ", "give a file's path"),
])
def test_a_path_that_cannot_be_a_drain_file_is_refused_naming_the_flag(tmp_path: Path, make, needle: str) -> None:
    path = make(tmp_path)
    assert needle in check_drain_file(path)
    with pytest.raises(ValueError, match=r"drain_file \(--drain-file\): "):
        AgentConfig.from_env({"drain_file": "--drain-file"}, drain_file=path)


def test_a_good_path_and_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_drain_file(str(tmp_path / "drain")) == ""
    monkeypatch.setenv("TASKD_DRAIN_FILE", str(tmp_path / "drain"))
    assert AgentConfig.from_env().drain_file == str(tmp_path / "drain")
    monkeypatch.setenv("TASKD_DRAIN_FILE", str(tmp_path))
    with pytest.raises(ValueError, match=r"drain_file \(TASKD_DRAIN_FILE\): .* is a directory"):
        AgentConfig.from_env()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        assert "is not writable: the file is removed once acted on" in check_drain_file(str(tmp_path / "drain"))
    finally:
        tmp_path.chmod(0o700)
