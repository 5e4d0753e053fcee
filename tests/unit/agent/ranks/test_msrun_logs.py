"""msrun's worker logs as the agent keeps them: the killed incarnation's log kept under another name, and
every incarnation's log closed by one line with its wall-clock start and end (issue 13 item 7).

msrun itself reopens `worker_<rank>.log` with "w" at each spawn; here a file written the same way
stands in for each incarnation's output (real msrun: tests/e2e/framework/test_msrun_multinode.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from taskd.agent.ranks.control import MsrunLogs

WALL = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4}"


def spawn(log_dir: Path, rank: int, text: str) -> None:
    (log_dir / f"worker_{rank}.log").write_text(text)  # msrun: open(log, "w") at every spawn


def test_each_incarnation_keeps_its_log_and_ends_with_its_wall_clock_times(tmp_path: Path) -> None:
    logs = MsrunLogs(str(tmp_path), enabled=True)
    logs.before_start({0: 4, 1: 5})  # local ranks 0 and 1 are global ranks 4 and 5 (node 2 of 2 ranks each)
    spawn(tmp_path, 4, "rank 4 first\n")
    spawn(tmp_path, 5, "rank 5 first\n")
    logs.before_start({1: 5})  # rank 5 died and is restarted alone
    spawn(tmp_path, 5, "rank 5 second\n")
    logs.finish()

    kept = (tmp_path / "worker_5.log.0").read_text().splitlines()
    assert kept[0] == "rank 5 first"
    assert re.fullmatch(rf"==== taskd: rank 5 \(local 1\) start #0 at {WALL}, restarted at {WALL} ====", kept[-1])
    last = (tmp_path / "worker_5.log").read_text().splitlines()
    assert last[0] == "rank 5 second"
    assert re.fullmatch(rf"==== taskd: rank 5 \(local 1\) start #1 at {WALL}, job ended at {WALL} ====", last[-1])
    other = (tmp_path / "worker_4.log").read_text().splitlines()
    assert re.fullmatch(rf"==== taskd: rank 4 \(local 0\) start #0 at {WALL}, job ended at {WALL} ====", other[-1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker_4.log", "worker_5.log", "worker_5.log.0"]


def test_taskds_own_launcher_needs_none_of_this(tmp_path: Path) -> None:
    logs = MsrunLogs(str(tmp_path), enabled=False)
    logs.before_start({0: 0})
    logs.finish()
    assert list(tmp_path.iterdir()) == []
