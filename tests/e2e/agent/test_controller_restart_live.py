"""A controller restart while a live recover re-forms its group redoes nothing (issue 31, F2), end to end.

examples/torch/train_ddp.py (LiveGroup, gloo) on two `taskd run` nodes, one rank each, against one `taskd server`
with a state file. Rank 1 SIGKILLs itself; once the round is stored as RECOVERING (its replacement starting, the
survivor paused out of the broken group) the server is SIGKILLed and started again 1 s later on the same port and
state file. The round must go on where it was: the survivor keeps its pid, the replacement is started once (F2
measured it killed and replaced again, "2 recovery(ies)"), one restart charged, final.pt bit-identical.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from support import free_port, leftovers, wait_for  # noqa: E402
from test_controller_restart_round import node, server, status  # noqa: E402
from test_live_e2e import EXAMPLE, SMALL, assert_identical, start_pids, summary, taskd_run  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_controller_killed_during_a_live_recover_resumes_it_without_redoing_it(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = tmp_path_factory.mktemp("live-restart-reference")
    code, console = taskd_run(ref, nproc=2)
    assert code == 0, console[-6000:]
    expected = torch.load(ref / "out" / "final.pt")

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = "f2-live"
    script = [str(EXAMPLE), *SMALL, "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
              "--crash", "1:8"]
    master = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    with server(tmp_path) as ctl:
        procs = [node(tmp_path, ctl.address, job, r, [*master, *script]) for r in range(2)]
        try:
            wait_for(lambda: ctl.stored_state(job) == "RECOVERING recover" or any(p.poll() is not None for p in procs),
                     90, "the live recover's round stored as RECOVERING", interval=0.01)
            ctl.kill()
            stored = ctl.stored_state(job)
            time.sleep(1.0)
            ctl.start()
            codes = [p.wait(timeout=90) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
        consoles = [(tmp_path / f"node{r}.log").read_text() for r in range(2)]
        record = status(ctl.address, job)
        text = "\n".join(f"--- node{r}\n{c[-6000:]}" for r, c in enumerate(consoles))
        assert stored == "RECOVERING recover", f"killed too late: the round was stored as {stored}\n{text}"
        assert codes == [0, 0], f"{codes}\n{text}\n{ctl.logs()[-8000:]}"
    events = [e.get("kind") for e in record.get("events", [])]
    assert record.get("state") == "SUCCEEDED" and record.get("restarts") == 1, record
    assert [r.get("strategiesTried") for r in record.get("rounds", [])] == [["recover"]], record.get("rounds")
    assert "round_restored" in events and "round_resumed" not in events, events
    # the recover ran once: the survivor kept its process, rank 1 was replaced once, nothing was rescheduled
    first = {**start_pids(consoles[0]), **start_pids(consoles[1])}
    info = summary(tmp_path)
    assert info["ranks"]["0"]["pid"] == first[0], (info["ranks"], first)
    assert info["ranks"]["1"]["pid"] != first[1], (info["ranks"], first)
    assert len(re.findall(r"replaced rank\(s\) \[1\]", consoles[1])) == 1, consoles[1][-6000:]
    for console in consoles:
        assert console.count("strategy: recover for rank(s) [1]") == 1, console[-6000:]
        assert "job-rescheduling" not in console and "2 recovery(ies)" not in console, console[-6000:]
    assert_identical(torch.load(tmp_path / "out" / "final.pt"), expected)
    wait_for(lambda: leftovers(str(tmp_path / "out")) == [], 15, "no process of the job left")
    print("re-sent changeStrategy not redone:", sum(c.count("already carried out") for c in consoles), "time(s)")
