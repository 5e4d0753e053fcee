"""Soft history (streams opened and closed) is batched, not one SQLite transaction per agent;
everything answered 0 is still committed before its answer; shutdown does not record each closing stream."""

from __future__ import annotations

from pathlib import Path

from support import wait_for
from support.controller import kinds
from support.scripted_agent import ScriptedAgent

from taskd.controller.service.server import ControllerConfig, EmbeddedController
from taskd.controller.storage.store import Store


def test_shutdown_writes_the_batched_history_but_not_every_closing_stream(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    ctl = EmbeddedController(ControllerConfig(listen="127.0.0.1:0", state_path=str(path)))
    address = ctl.start()
    agents = [ScriptedAgent(address, "j", node_rank=n, node_count=5) for n in range(5)]
    try:
        for a in agents:
            a.join()
            a.next_signal(keepalive=True)  # the stream is live
        wait_for(lambda: all(r.subscribed for r in agents[0].list_jobs("j").jobs[0].agents), 20, "5 subscriptions")
    finally:
        ctl.stop()
        for a in agents:
            a.close()
    store = Store(path)
    history = kinds(store, "j")
    store.close()
    assert history.count("agent_subscribed") == 5 and "agent_unsubscribed" not in history


