"""Every way the agent can end leaves no rank behind: here, an exception inside supervision."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from taskd.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin
from taskd.launcher import LocalLauncher, WorkerSpec


def test_exception_in_a_callback_stops_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(120)\n")
    launcher = LocalLauncher(WorkerSpec(entrypoint=[sys.executable, str(script)], nproc_per_node=3))
    plugin = MSRunPlugin(details=launcher, launcher="taskd", monitor_interval=0.1, stop_grace=1.0)
    callbacks = launcher.callbacks()
    calls = {"n": 0}
    started: set[int] = set()

    def flaky_monitor(ranks: list[int]) -> dict:
        answer = callbacks["MONITOR"](ranks)
        if any(e.get("pid") for e in answer.values()):
            started.update(e["pid"] for e in answer.values() if e.get("pid"))
            calls["n"] += 1
            if calls["n"] > 5:  # well after the ranks started: the launcher "breaks"
                raise RuntimeError("launcher lost its mind")
        return answer

    for name, func in callbacks.items():
        plugin.register_callbacks(name, flaky_monitor if name == "MONITOR" else func)
    try:
        with pytest.raises(RuntimeError, match="lost its mind"):
            plugin.run()
        assert len(started) == 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(psutil.pid_exists(p) and
                                                  psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                                  for p in started):
            time.sleep(0.05)
        alive = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], "ranks survived an exception in the agent"
        assert plugin.result is None or not plugin.result.succeeded
    finally:
        launcher.close(1.0)


@pytest.mark.timeout(60)
def test_rank_that_never_starts_is_a_fault_not_a_wait(tmp_path: Path) -> None:
    """A launcher that leaves a rank unstarted (MONITOR status 200) must not make the agent wait forever."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(120)\n")
    launcher = LocalLauncher(WorkerSpec(entrypoint=[sys.executable, str(script)], nproc_per_node=2))
    plugin = MSRunPlugin(details=launcher, launcher="taskd", monitor_interval=0.1, stop_grace=1.0, max_restarts=0)
    callbacks = launcher.callbacks()
    for name, func in callbacks.items():
        plugin.register_callbacks(name, func)
    plugin.register_callbacks("START_ALL_WORKER", lambda: launcher.start_worker_list([0]) or 1)  # rank 1 never starts
    try:
        result = plugin.run()
        assert not result.succeeded
        assert result.first_failure is not None and result.first_failure.global_rank == 1
        assert launcher.monitor([0])[0]["status"] is not None, "the started rank was stopped too"
    finally:
        launcher.close(1.0)


def test_bad_controller_address_ends_the_agent_with_2_and_a_clear_line(tmp_path: Path, caplog) -> None:
    """Under msrun a malformed MINDX_SERVER_IP must not surface as a traceback inside msrun, nor start ranks."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(120)\n")
    launcher = LocalLauncher(WorkerSpec(entrypoint=[sys.executable, str(script)], nproc_per_node=1))
    plugin = MSRunPlugin(details=launcher, launcher="taskd", server="bad:host:1", monitor_interval=0.1)
    for name, func in launcher.callbacks().items():
        plugin.register_callbacks(name, func)
    try:
        with caplog.at_level("ERROR", logger="taskd"), pytest.raises(SystemExit) as exit_:
            plugin.start()
        assert exit_.value.code == 2
        assert "taskd cannot start the job: bad controller address 'bad:host:1'" in caplog.text
        assert launcher.pid(0) is None, "no rank may start on a configuration error"
    finally:
        launcher.close(1.0)
