"""Storage faults (issue 11, H3/H2): a change the state file cannot take is refused with its real cause, memory
goes back to what the disk holds, nobody is signalled, and the controller keeps serving.

The faults are real: SQLite's own `PRAGMA max_page_count` makes it raise "database or disk is full" when the
file would grow, and the write-ahead log's descriptor swapped for a read-only one makes every write fail
with EBADF, which SQLite reports as "disk I/O error".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from support.controller import ALL, BIG, disk, memory, ok
from support.scripted_agent import ScriptedAgent, StreamEnded

from taskd.controller.core import ControllerCore
from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.vocabulary import Code

T = TypeVar("T")
CORE_LOG = "taskd.controller.core"


def config(path: Path) -> ControllerConfig:
    return ControllerConfig(listen="127.0.0.1:0", state_path=str(path), keepalive_interval=0.3, stop_timeout=60,
                            strategy_timeout=60, recover_timeout=60, resume_timeout=60)


def on_loop(ctl: EmbeddedController, fn: Callable[[], T]) -> T:
    """Run `fn` on the controller's event loop (the store and the core belong to that thread)."""
    async def call() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), ctl._loop).result(10)  # type: ignore[arg-type]


def core_of(ctl: EmbeddedController) -> ControllerCore:
    assert ctl.server is not None and ctl.server.core is not None
    return ctl.server.core


def cap_pages(ctl: EmbeddedController, cap: bool) -> None:
    """Cap the state file at its current size (SQLite then raises "database or disk is full"), or lift the cap."""
    def apply() -> None:
        conn = core_of(ctl).store.conn
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # no free page to grow into
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages if cap else 1 << 30}")
    on_loop(ctl, apply)


def fd_of(path: str) -> int:
    (fd,) = [int(fd) for fd in os.listdir("/proc/self/fd")
             if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(path)]
    return fd


@contextlib.contextmanager
def broken_wal(ctl: EmbeddedController, state: Path) -> Iterator[None]:
    """The controller's write-ahead log descriptor made read-only: each write fails (EBADF, "disk I/O error")."""
    wal = str(state) + "-wal"
    fd = fd_of(wal)
    saved = os.dup(fd)

    def swap(to: int) -> None:
        os.dup2(to, fd)

    readonly = os.open(wal, os.O_RDONLY)
    on_loop(ctl, lambda: swap(readonly))
    os.close(readonly)
    try:
        yield
    finally:
        on_loop(ctl, lambda: swap(saved))
        os.close(saved)




def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == CORE_LOG and r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------------- a live controller, a full disk


def test_full_disk_refuses_the_fault_with_its_cause_and_changes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    caplog.set_level(logging.INFO, logger="taskd")
    with EmbeddedController(config(state)) as ctl:
        a = [ScriptedAgent(ctl.address, "a", n, 2).join() for n in range(2)]
        b = ScriptedAgent(ctl.address, "b").join()
        before = a[0].list_jobs("a").jobs[0]
        caplog.clear()
        cap_pages(ctl, True)
        status = a[0].fault({0: 1}, detail=BIG)
        assert status.code == Code.STORAGE_ERROR == 503
        assert "database or disk is full" in status.info and "cannot rollback" not in status.info
        assert "nothing changed" in status.info
        (line,) = errors(caplog)  # one loud line, no traceback
        assert "database or disk is full" in line.getMessage() and line.exc_info is None
        for agent in a:
            agent.no_signal(0.5)  # no stopTrain for a change that was not stored
        job = a[0].list_jobs("a").jobs[0]
        assert (job.state, job.restarts, len(job.rounds), job.info) == ("RUNNING", 0, 0, before.info)
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        ok(b.health())  # the controller keeps serving while the disk is full

        cap_pages(ctl, False)  # space again: the same report now goes through, and so does the other job's
        ok(a[0].fault({0: 1}, detail=BIG))
        for agent in a:
            agent.expect("stopTrain")
        ok(b.fault({0: 1}))
        b.expect("stopTrain")
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        for agent in (*a, b):
            agent.close()
    with EmbeddedController(config(state)) as again:  # and a restart loads exactly that
        jobs = {j.jobId: j for j in ScriptedAgent(again.address, "x").list_jobs().jobs}
        assert jobs["a"].state == jobs["b"].state == "RESUMING" and len(jobs["a"].rounds) == 1


def test_full_disk_mid_round_keeps_the_round_where_it_was(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        a = [ScriptedAgent(ctl.address, "a", n, 2).join() for n in range(2)]
        ok(a[0].fault({0: 1}))
        for agent in a:
            agent.expect("stopTrain")
        ok(a[0].stop_complete())
        cap_pages(ctl, True)
        status = a[1].stop_complete(info=BIG)  # the last answer: it would move the round on to COLLECTING
        assert status.code == Code.STORAGE_ERROR and "database or disk is full" in status.info
        for agent in a:
            agent.no_signal(0.5)  # no globalFault
        assert a[0].list_jobs("a").jobs[0].state == "STOPPING"
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        round_ = on_loop(ctl, lambda: core_of(ctl).jobs["a"].round)
        assert round_ is not None and round_.acks == {0}  # node 1's answer was undone, node 0's kept
        cap_pages(ctl, False)
        ok(a[1].stop_complete())  # the agent sends it again: the round goes on from where it was
        for agent in a:
            agent.expect("globalFault")
        for agent in a:
            ok(agent.strategies(ALL))
        for agent in a:
            agent.expect("changeStrategy", "recover")  # nothing excluded by the refused answer
        for agent in a:
            agent.close()


def test_disk_io_error_refuses_with_its_cause_and_the_controller_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        a = ScriptedAgent(ctl.address, "a").join()
        b = ScriptedAgent(ctl.address, "b").join()
        caplog.clear()
        with broken_wal(ctl, state):
            status = a.fault({0: 1})
            assert status.code == Code.STORAGE_ERROR and "disk I/O error" in status.info, status.info
            assert "cannot rollback" not in status.info
            a.no_signal(0.5)
            assert a.list_jobs("a").jobs[0].state == "RUNNING"  # reads still work
            assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
            assert b.finished(0).code == Code.STORAGE_ERROR  # every write fails, the controller answers each
            assert b.list_jobs("b").jobs[0].state == "RUNNING"
        assert [r for r in errors(caplog) if "disk I/O error" in r.getMessage() and r.exc_info is None]
        ok(a.fault({0: 1}))  # the file is writable again: the same connection carries on
        a.expect("stopTrain")
        ok(b.finished(0))
        assert b.list_jobs("b").jobs[0].state == "SUCCEEDED"
        assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        a.close()
        b.close()


def test_a_subscription_whose_change_cannot_be_stored_is_ended_and_can_come_again(tmp_path: Path) -> None:
    """After a controller restart the last agent back resumes the round (stopTrain, a stored change). If that
    cannot be stored the stream is ended rather than left open while the job says it is not."""
    state = tmp_path / "ctl.sqlite3"
    with EmbeddedController(config(state)) as ctl:
        agent = ScriptedAgent(ctl.address, "a").join()
        ok(agent.fault({0: 1}))
        agent.expect("stopTrain")
        agent.close()
    with EmbeddedController(config(state)) as ctl:
        agent = ScriptedAgent(ctl.address, "a")  # the same process, reconnecting
        ok(agent.init())
        ok(agent.register())
        with broken_wal(ctl, state):
            agent.subscribe()
            with pytest.raises(StreamEnded):
                agent.next_signal(10)  # ended, without the stopTrain of a resumption that was not stored
            job = agent.list_jobs("a").jobs[0]
            assert job.state == "RESUMING" and not job.agents[0].subscribed
            assert on_loop(ctl, lambda: memory(core_of(ctl))) == disk(state)
        agent.subscribe()
        agent.expect("stopTrain")  # the round resumes now
        assert agent.list_jobs("a").jobs[0].state == "STOPPING"
        agent.close()


# ---------------------------------------------------------------------------- the core, with a clock


# ---------------------------------------------------------------------------- the checkpoint, event by event


